package httpapi_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/pipenet"
)

// blockingEngine is ready and answers GET /status only once release is
// closed, ignoring the request's cancellation (Status takes no context).
type blockingEngine struct {
	httpapi.Engine // nil: any other method panics
	entered        chan struct{}
	release        chan struct{}
	returned       atomic.Bool
}

func (e *blockingEngine) Ready() bool               { return true }
func (e *blockingEngine) Layouts() []engine.Layout  { return nil }
func (e *blockingEngine) Counters() engine.Counters { return engine.Counters{} }
func (e *blockingEngine) Status() map[string]any {
	close(e.entered)
	<-e.release
	e.returned.Store(true)
	return map[string]any{}
}

// TestServeReturnsAfterHandlerPastDrain: a /status handler that outlives
// Serve's 5 s drain deadline has its connection closed, and Serve returns
// only after the handler has returned, so the data path's release (the
// engine's Close, stood in for by what runs after Serve) never runs under
// it.
func TestServeReturnsAfterHandlerPastDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eng := &blockingEngine{entered: make(chan struct{}), release: make(chan struct{})}
		srv, err := httpapi.New(httpapi.Options{Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.SetEngine(eng); err != nil {
			t.Fatal(err)
		}
		ln := pipenet.New()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		type result struct {
			err             error
			handlerReturned bool // when the engine would be closed
		}
		served := make(chan result, 1)
		go func() {
			err := srv.Serve(ctx, ln)
			served <- result{err, eng.returned.Load()}
		}()

		code := ln.Get("/status")
		<-eng.entered
		cancel()
		// The connection ends without a response once the drain deadline
		// has passed and Serve closed it.
		if c := <-code; c != -1 {
			t.Fatalf("status %d, want the connection closed", c)
		}
		synctest.Wait()
		select {
		case r := <-served:
			t.Fatalf("Serve returned (%v) while the handler was still running", r.err)
		default:
		}
		close(eng.release)
		r := <-served
		if !r.handlerReturned {
			t.Fatal("Serve returned before the handler did")
		}
		if !errors.Is(r.err, context.DeadlineExceeded) || r.err.Error() != "httpapi: shutdown: httplimit: drain deadline 5s passed with 1 requests running; closed their connections and waited for their handlers: context deadline exceeded" {
			t.Fatalf("Serve: %v", r.err)
		}
	})
}
