package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/polltest"
	"github.com/lmcache-go/lmcache/internal/proctest"
)

// proc is one running lmcache process (internal/proctest).
type proc = proctest.Proc

// lmcacheBin is the binary built once for this test process.
func lmcacheBin(t *testing.T) string {
	t.Helper()
	bin, _ := proctest.Binary(t)
	return bin
}

// start runs the binary; cleanup stops it and requires a clean exit.
func start(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	return proctest.Start(t, name, env, args...)
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	return proctest.FreePort(t)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

var client = &http.Client{Timeout: 30 * time.Second}

// call does one HTTP request with an optional JSON body and headers, and
// decodes a JSON reply into out when out is non-nil.
func call(t *testing.T, method, url string, body any, hdr map[string]string, out any) (int, http.Header) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if _, isJSON := body.([]byte); !isJSON && body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, url, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode, resp.Header
}

// waitFor polls cond until it holds; the deadline only bounds a failing test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, 60*time.Second, what, cond)
}

func healthy(url string) func() bool {
	return func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
