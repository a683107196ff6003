package engine

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestQueuedUploadsDroppedAtStopCounted: uploads still waiting when the
// engine stops (here backing off after a failed first attempt, the next
// one an hour away) are dropped, unpinned and counted in
// StoreQueueDropped, once per object.
func TestQueuedUploadsDroppedAtStopCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bad := newFake("bad")
		bad.failing.Store(true)
		h := start(t, Config{StoreMaxAttempts: 5, StoreRetryBase: time.Hour, EvictionPolicy: PolicyNoop}, bad)
		h.mustPut(t, flat(chunks("", 0, 4, 1)))
		synctest.Wait() // the first attempt failed; all 4 back off
		if c := h.Counters(); c.L2[0].StoreFailed < 1 || c.L1PendingUpload != 4 || c.StoreQueueDropped != 0 {
			t.Fatalf("before stop: failed %d, pending uploads %d, dropped %d; want >= 1, 4, 0", c.L2[0].StoreFailed, c.L1PendingUpload, c.StoreQueueDropped)
		}
		h.stop(t) // fails if a pin is left
		if c := h.Counters(); c.StoreQueueDropped != 4 {
			t.Fatalf("StoreQueueDropped = %d after stopping with 4 uploads backing off, want 4", c.StoreQueueDropped)
		}
	})
}
