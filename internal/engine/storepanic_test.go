package engine

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// panickyStore is a fake adapter whose first Store panics, as a faulty
// adapter would; the store worker loop recovers it.
type panickyStore struct {
	*fakeAdapter
	once sync.Once
}

func (p *panickyStore) Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error {
	p.once.Do(func() { panic("adapter store failed") })
	return p.fakeAdapter.Store(ctx, keys, objs)
}

// TestPanickedUploadIsRetried: an adapter's Store that panics (the worker
// loop recovers it and records the failure) counts as a failed attempt: the
// batch backs off and is retried, so the objects land, their pins drop and
// the in-flight gauge returns to 0, instead of the batch vanishing with its
// objects pinned in L1 for good (the harness's leak check at stop names any
// pin left).
func TestPanickedUploadIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake("l2")
		h := start(t, Config{StoreRetryBase: time.Second, EvictionPolicy: PolicyNoop}, &panickyStore{fakeAdapter: fake})
		defer h.stop(t)
		keys := flat(chunks("", 0, 3, 1))
		h.mustPut(t, keys)
		time.Sleep(5 * time.Second) // the panicked attempt at 0 s, its retry at 1 s
		synctest.Wait()
		c := h.Counters()
		if a := c.L2[0]; a.StoreFailed != 1 || a.StoreRetried != 3 || a.StoreObjects != 3 || a.PendingStores != 0 || a.InflightStores != 0 || a.StoreAbandoned != 0 {
			t.Fatalf("after a panicked upload: failed %d retried %d stored %d pending %d in flight %d abandoned %d; want 1 3 3 0 0 0",
				a.StoreFailed, a.StoreRetried, a.StoreObjects, a.PendingStores, a.InflightStores, a.StoreAbandoned)
		}
		if c.L1PendingUpload != 0 {
			t.Fatalf("%d objects still pinned after their retried upload landed", c.L1PendingUpload)
		}
		for _, k := range keys {
			if b, ok := fake.has(k); !ok || !bytes.Equal(b, pattern(k, objSize)) {
				t.Fatalf("object %v missing or corrupted in L2 after the retry", k)
			}
		}
		var failedRuns int64
		for _, s := range h.cfg.Loops.All() {
			if strings.HasPrefix(s.Name, LoopStorePrefix) {
				failedRuns += s.FailedRuns
			}
		}
		if failedRuns != 1 {
			t.Fatalf("store workers recorded %d failed runs, want 1 (the panic)", failedRuns)
		}
	})
}
