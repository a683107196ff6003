package coordinator_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/httplimit"
)

// TestRegisterLaxFloatPort: http_port 8080.0 is accepted as Pydantic's lax
// int and listed as 8080; 8080.5 is refused.
func TestRegisterLaxFloatPort(t *testing.T) {
	c := startCoord(t, nil)
	c.must("POST", "/instances", `{"instance_id":"f1","ip":"10.0.0.1","http_port":8080.0}`, 200)
	_, raw := c.do("GET", "/instances", nil)
	var l struct {
		Instances []struct {
			InstanceID string          `json:"instance_id"`
			HTTPPort   json.RawMessage `json:"http_port"`
		} `json:"instances"`
	}
	if err := json.Unmarshal(raw, &l); err != nil || len(l.Instances) != 1 || l.Instances[0].InstanceID != "f1" || string(l.Instances[0].HTTPPort) != "8080" {
		t.Fatalf("GET /instances %s: %v", raw, err)
	}
	c.must("POST", "/instances", `{"instance_id":"f2","ip":"10.0.0.1","http_port":8080.5}`, 422)
}

// TestQuotaSaltInfinityLiteral422: a bare Infinity (or NaN) literal is not
// JSON here: 422, and the salt keeps no quota.
func TestQuotaSaltInfinityLiteral422(t *testing.T) {
	c := startCoord(t, nil)
	for _, body := range []string{`{"limit_gb": Infinity}`, `{"limit_gb": -Infinity}`, `{"limit_gb": NaN}`} {
		c.must("PUT", "/quota/lit", body, 422)
	}
	if g := c.must("GET", "/quota/lit", nil, 200); g["quota_exists"] != false {
		t.Fatalf("after the refused writes: %v", g)
	}
}

// TestPrefetchUndecodableReplyAndNullRequestID: a 2xx submit reply that is
// not JSON is 502; one with "request_id": null gives "".
func TestPrefetchUndecodableReplyAndNullRequestID(t *testing.T) {
	c := startCoord(t, nil)
	mp := newMP(t)
	mp.register(c, "mp-1")
	body := map[string]any{"instance_id": "mp-1", "model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5}, "cache_salt": "a"}
	mp.mu.Lock()
	mp.submitCode, mp.submitBody = 202, `not json`
	mp.mu.Unlock()
	if g := c.must("POST", "/cache/prefetches", body, 502); !strings.HasPrefix(g["detail"].(string), "prefetch submit to 'mp-1' failed") {
		t.Fatalf("undecodable reply: %v", g)
	}
	mp.mu.Lock()
	mp.submitCode, mp.submitBody = 202, `{"request_id":null,"chunks":1,"status":"submitted"}`
	mp.mu.Unlock()
	if code, raw := c.do("POST", "/cache/prefetches", body); code != 200 || string(raw) != `{"instance_id":"mp-1","request_id":"","chunks":1,"status":"submitted"}` {
		t.Fatalf("null request_id: %d %s", code, raw)
	}
}

// TestErrorTableHidesInternal: the coordinator's sentinel table turns
// HideInternal on, so an unmapped error or a recovered handler panic is a
// bare 500 (the mechanism is httproute.TestHideInternal's).
func TestErrorTableHidesInternal(t *testing.T) {
	if !coordinator.APIErrorsHideInternal() {
		t.Fatal("apiErrors.HideInternal is off")
	}
}

// TestHeaderLimitsConfigured: the coordinator serves with httplimit's
// defaults, 128 KiB of header block, 512 connections and 10 s to send the
// header block. The size is pinned on the wire (net/http allows its 4 KiB
// and bufio slop past MaxHeaderBytes, about 6 KiB): 127 KiB passes, 136 KiB
// is 431, so a server on half or twice the bound fails one side.
func TestHeaderLimitsConfigured(t *testing.T) {
	if httplimit.DefaultMaxHeaderBytes != 128<<10 || httplimit.DefaultMaxConns != 512 || httplimit.DefaultReadHeaderTimeout != 10*time.Second {
		t.Fatalf("httplimit defaults %d %d %v", httplimit.DefaultMaxHeaderBytes, httplimit.DefaultMaxConns, httplimit.DefaultReadHeaderTimeout)
	}
	c := startCoord(t, nil)
	for _, tc := range []struct {
		size int
		want int
	}{{127 << 10, 200}, {136 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, err := http.NewRequest("GET", c.base+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Big", strings.Repeat("a", tc.size))
		resp, err := c.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%d-byte header: status %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}

// TestHeaderDeadlineIsTenSeconds: on the fake clock, a header block
// finished 1 ms before 10 s is served; a connection still sending it 1 ms
// after 10 s is closed by the server.
func TestHeaderDeadlineIsTenSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln, stop := runPiped(t, testConfig())
		defer stop()

		conn := ln.Dial()
		defer conn.Close()
		if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10*time.Second - time.Millisecond)
		if _, err := conn.Write([]byte("\r\n")); err != nil {
			t.Fatalf("before the deadline: %v", err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("before the deadline: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("before the deadline: status %d", resp.StatusCode)
		}

		late := ln.Dial()
		defer late.Close()
		if _, err := late.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10*time.Second + time.Millisecond)
		_, _ = late.Write([]byte("\r\n"))
		buf := make([]byte, 1)
		if n, err := late.Read(buf); n != 0 || err == nil {
			t.Fatalf("after the deadline: read %d bytes, err %v; want the connection closed", n, err)
		} else if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "closed") {
			t.Fatalf("after the deadline: err %v, want EOF or closed", err)
		}
	})
}
