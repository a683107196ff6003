package httpapi_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestBodyReadDeadline: on every route that reads a body, a client that
// announces a body and never finishes it gets 408 once BodyReadTimeout
// passes, instead of holding the connection.
func TestBodyReadDeadline(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.BodyReadTimeout = 200 * time.Millisecond }})
	addr := strings.TrimPrefix(e.base, "http://")
	n := 0
	for _, r := range httpapi.Routes() {
		if r.Body != "application/json" && r.Body != "application/octet-stream" {
			continue
		}
		n++
		path := routePath(r)
		hdr := "Content-Type: application/json\r\n"
		length := 1000
		if r.Path == "/api/kv/store" {
			// Valid headers for one chunk, so the handler reaches the body.
			hdr = fmt.Sprintf("%s: %s\r\n%s: %s\r\n", httpapi.HeaderModel, testModel, httpapi.HeaderTokens, tokens(0, testChunk))
			length = objBytes
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n{\"a", r.Method, path, hdr, length)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("%s %s: %v", r.Method, path, err)
		}
		resp.Body.Close()
		c.Close()
		req, _ := http.NewRequest(r.Method, e.base+path, nil)
		record(req, resp.StatusCode)
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("%s %s with a stalled body: %d, want 408", r.Method, path, resp.StatusCode)
		}
		if !contains(r.Statuses, 408) {
			t.Errorf("%s %s does not document 408", r.Method, r.Path)
		}
	}
	if n != 9 {
		t.Fatalf("%d body routes, want 9", n)
	}
}

// TestBodyDeadlinePerRouteLimit: the body read deadline is
// Options.BodyReadTimeout (default 30 s) per started 16 MiB of the route's
// limit: the 1 MiB routes (quota, clear, reconfigure) and the run_script
// form get 30 s, the 16 MiB JSON routes 30 s, the default 1 GiB KV store
// 32 min; a configured timeout scales the same way.
func TestBodyDeadlinePerRouteLimit(t *testing.T) {
	def, err := httpapi.New(httpapi.Options{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if got := httpapi.MaxKVBodyBytes(def); got != 1<<30 {
		t.Fatalf("default KV body limit %d, want 1 GiB", got)
	}
	for _, c := range []struct {
		name  string
		limit int64
		want  time.Duration
	}{
		{"1 MiB routes", httpapi.MaxSmallBody, 30 * time.Second},
		{"run_script form", httpapi.MaxScriptForm, 30 * time.Second},
		{"16 MiB routes", httpapi.MaxJSONBody, 30 * time.Second},
		{"KV store", httpapi.MaxKVBodyBytes(def), 32 * time.Minute},
	} {
		if got := httpapi.BodyDeadline(def, c.limit); got != c.want {
			t.Errorf("%s (%d bytes): deadline %v, want %v", c.name, c.limit, got, c.want)
		}
	}
	custom, err := httpapi.New(httpapi.Options{Logger: quietLogger(), BodyReadTimeout: 2 * time.Second, MaxKVBodyBytes: 40 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := httpapi.BodyDeadline(custom, httpapi.MaxKVBodyBytes(custom)); got != 6*time.Second {
		t.Errorf("40 MiB at 2 s per 16 MiB: %v, want 6s", got)
	}
}
