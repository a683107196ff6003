package coordinator_test

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestBodyReadDeadline: a client that sends a body's headers and then
// trickles (here: stops sending) gets 408 in FastAPI's shape once the
// route's read deadline has passed, 30 s for a 1 MiB route and 2 min for
// the 64 MiB event route, and not a moment before, so it cannot hold one
// of the capped connections for ever. The coordinator runs in a synctest
// bubble on in-memory connections, so the deadlines pass on its fake
// clock.
func TestBodyReadDeadline(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		deadline     time.Duration
	}{
		{"PUT", "/quota/config", 30 * time.Second},
		{"POST", "/quota/events", 2 * time.Minute},
	} {
		t.Run(tc.path, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ln, stop := runPiped(t, testConfig())
				defer stop()
				conn := ln.Dial()
				defer conn.Close()
				head := tc.method + " " + tc.path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"default_"
				if _, err := conn.Write([]byte(head)); err != nil {
					t.Fatal(err)
				}
				got := make(chan *http.Response, 1)
				go func() {
					resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
					if err != nil {
						t.Errorf("read response: %v", err)
					}
					got <- resp
				}()
				synctest.Wait()
				time.Sleep(tc.deadline - time.Millisecond)
				synctest.Wait()
				select {
				case resp := <-got:
					t.Fatalf("answered %v before the %v deadline", resp, tc.deadline)
				default:
				}
				time.Sleep(2 * time.Millisecond)
				synctest.Wait()
				var resp *http.Response
				select {
				case resp = <-got:
				default:
					t.Fatalf("no answer %v past the %v deadline", time.Millisecond, tc.deadline)
				}
				if resp == nil {
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestTimeout || !strings.HasPrefix(string(body), `{"detail":`) {
					t.Fatalf("trickled body: %d %s, want 408 {\"detail\": ...}", resp.StatusCode, body)
				}
			})
		})
	}
}
