package coordinator_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/pipenet"
)

// TestRunClosesDepsAfterHandlerPastDrain: a request whose handler outlives
// the drain deadline and ignores its cancelled context has its connection
// closed, and Run closes the MP client and the HA session only after the
// handler has returned (before the fix, srv.Close returned at once and
// they were closed under it).
func TestRunClosesDepsAfterHandlerPastDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered, cancelled, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var returned atomic.Bool
		closing := make(chan bool, 1) // whether the handler had returned when Run closed its dependencies
		srv, err := coordinator.New(testConfig(),
			coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
			coordinator.WithDrainTimeout(time.Second),
			coordinator.WithBeforeClose(func() { closing <- returned.Load() }))
		if err != nil {
			t.Fatal(err)
		}
		srv.WrapHandler(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/block" {
					next.ServeHTTP(w, r)
					return
				}
				close(entered)
				<-r.Context().Done() // the close after the drain deadline
				close(cancelled)
				<-release // then it ignores the cancellation, as a handler mid-write to etcd would
				returned.Store(true)
			})
		})
		ln := pipenet.New()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ran := make(chan error, 1)
		go func() { ran <- srv.Run(ctx, ln) }()

		code := ln.Get("/block")
		<-entered
		cancel()
		<-cancelled
		synctest.Wait()
		select {
		case v := <-closing:
			t.Fatalf("Run closed its dependencies while the handler was running (handler returned: %v)", v)
		default:
		}
		close(release)
		if !<-closing {
			t.Fatal("Run closed its dependencies before the handler returned")
		}
		if err := <-ran; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if c := <-code; c != -1 {
			t.Fatalf("status %d, want the connection closed", c)
		}
	})
}
