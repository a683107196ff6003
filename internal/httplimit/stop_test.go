package httplimit_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/httplimit"
	"github.com/lmcache-go/lmcache/internal/pipenet"
)

// lineWriter hands each log line to a channel, so a test can wait for it.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) { w <- string(p); return len(p), nil }

// TestStopWaitsForHandlerPastDrain: a handler that outlives the drain
// deadline and ignores its cancelled context keeps Stop from returning
// (so the caller's dependency close cannot run under it). Stop logs it
// once, naming it, and returns after it has returned, with the deadline
// error and the number of requests cut off.
func TestStopWaitsForHandlerPastDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		started, cancelled, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var returned atomic.Bool
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-r.Context().Done() // the close after the drain deadline
			close(cancelled)
			<-release // then it ignores the cancellation
			returned.Store(true)
		})
		logs := make(lineWriter, 4)
		ln := pipenet.New()
		srv := httplimit.NewServer(h, httplimit.Limits{}, log.New(logs, "", 0))
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		code := ln.Get("/stuck")
		<-started

		// What the caller would close after Stop: it records whether the
		// handler had returned by then.
		type result struct {
			err             error
			handlerReturned bool
		}
		stopped := make(chan result, 1)
		go func() {
			err := srv.Stop(time.Second)
			stopped <- result{err, returned.Load()}
		}()
		<-cancelled
		if line := <-logs; line != "httplimit: 1 handler (GET /stuck) still running 5s after their connections were closed; shutdown waits for them\n" {
			t.Fatalf("log %q", line)
		}
		synctest.Wait()
		select {
		case r := <-stopped:
			t.Fatalf("Stop returned (%v) while the handler was still running", r.err)
		default:
		}
		if n := srv.Running(); n != 1 {
			t.Fatalf("Running = %d, want 1", n)
		}
		close(release)
		r := <-stopped
		if !r.handlerReturned {
			t.Fatal("Stop returned before the handler did")
		}
		if !errors.Is(r.err, context.DeadlineExceeded) || r.err.Error() != "httplimit: drain deadline 1s passed with 1 requests running; closed their connections and waited for their handlers: context deadline exceeded" {
			t.Fatalf("Stop: %v", r.err)
		}
		if c := <-code; c != -1 {
			t.Fatalf("client got status %d from a closed connection", c)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
		if n := srv.Running(); n != 0 {
			t.Fatalf("Running = %d after Stop", n)
		}
		if len(logs) != 0 {
			t.Fatalf("extra log %q", <-logs)
		}
	})
}

// TestStopDrainsInTime: a request that finishes within the drain deadline
// gets its response, and Stop returns nil only after its handler returned.
func TestStopDrainsInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		started, release := make(chan struct{}), make(chan struct{})
		var returned atomic.Bool
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			returned.Store(true)
		})
		ln := pipenet.New()
		srv := httplimit.NewServer(h, httplimit.Limits{}, log.New(io.Discard, "", 0))
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		code := ln.Get("/slow")
		<-started
		stopped := make(chan bool, 1)
		go func() {
			if err := srv.Stop(time.Minute); err != nil {
				t.Errorf("Stop: %v", err)
			}
			stopped <- returned.Load()
		}()
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("Stop returned while the handler was still running")
		default:
		}
		close(release)
		if !<-stopped {
			t.Fatal("Stop returned before the handler did")
		}
		if c := <-code; c != http.StatusOK {
			t.Fatalf("status %d", c)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
	})
}
