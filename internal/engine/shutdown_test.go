package engine

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// stuckAdapter's uploads never finish on their own: they end only when the
// engine cancels them, which is what an S3 outage looks like at shutdown.
type stuckAdapter struct {
	*fakeAdapter
	started chan struct{}
}

func (s *stuckAdapter) Store(ctx context.Context, _ []objkey.Key, _ [][]byte) error {
	select {
	case s.started <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestRunReturnsWithUploadsQueued: cancelling Run while write-behind uploads
// are in flight and queued must stop the store workers (they used to requeue
// the cancelled batch and spin on it forever).
func TestRunReturnsWithUploadsQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &stuckAdapter{fakeAdapter: newFake("stuck"), started: make(chan struct{}, 1)}
		h := start(t, Config{}, a)
		h.mustPut(t, flat(chunks("", 0, 8, 1)))
		<-a.started
		synctest.Wait()
		h.stop(t) // returns only if every worker stopped
		if c := h.Counters(); c.L2[0].StoreObjects != 0 {
			t.Fatalf("a cancelled upload counted as stored: %+v", c.L2[0])
		}
	})
}
