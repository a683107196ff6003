package pipenet

import (
	"errors"
	"net"
	"net/http"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServesHTTPInABubble: an http.Server on the Listener answers Get
// inside a synctest bubble (200 for a known path, 404 otherwise), a
// connection that ends without a response reads -1, and Accept returns
// net.ErrClosed once the Listener is closed.
func TestServesHTTPInABubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /ok", func(http.ResponseWriter, *http.Request) {})
		mux.HandleFunc("GET /hang", func(w http.ResponseWriter, r *http.Request) {
			panic(http.ErrAbortHandler) // closes the connection without a response
		})
		srv := &http.Server{Handler: mux}
		ln := New()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		for path, want := range map[string]int{"/ok": 200, "/nope": 404, "/hang": -1} {
			if got := <-ln.Get(path); got != want {
				t.Errorf("GET %s = %d, want %d", path, got, want)
			}
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve = %v", err)
		}
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close = %v", err)
		}
	})
}
