package mq_test

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestTransfersOpenAtStopAreCounted: a PREPARE_RETRIEVE and a
// PREPARE_STORE whose COMMITs never come before the server stops are
// aborted by Run's shutdown and counted in
// lmcache_mp_zmq_abandoned_transfers_total, the counter the reaper's drops
// use (the harness's cleanup then shows the engine holds nothing). The
// socket goroutine's watch is registered as a running high-level loop.
func TestTransfersOpenAtStopAreCounted(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(41, 2*testChunk)
	w.store(tokens, 0, 2*testChunk, "s", data.of(41, 0))
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "r"), 2)
	if ok, _, err := w.c.PrepareRetrieve(key("m", 1, 0, tokens, 0, 2*testChunk, "r"), w.inst); err != nil || !ok {
		t.Fatalf("PREPARE_RETRIEVE = %v %v", ok, err)
	}
	if plan, err := w.c.PrepareStore(key("m", 1, 0, prompt(42, testChunk), 0, testChunk, "s2"), w.inst); err != nil || len(plan.Slots) != 1 {
		t.Fatalf("PREPARE_STORE = %+v %v", plan, err)
	}
	if st, ok := h.srv.Periodic().Get("mq-socket-loop"); !ok || !st.IsRunning || st.Level != periodic.High {
		t.Fatalf("socket loop watch %+v (registered %v)", st, ok)
	}
	if n := counterValue(h.srv.Metrics().ZMQAbandonedTransfers); n != 0 {
		t.Fatalf("abandoned transfers %v before stop, want 0", n)
	}
	h.stop()
	if n := counterValue(h.srv.Metrics().ZMQAbandonedTransfers); n != 2 {
		t.Errorf("abandoned transfers counted %v at stop, want 2", n)
	}
	if n := strings.Count(h.logs.String(), "dropped transfers still open at stop (counted in lmcache_mp_zmq_abandoned_transfers_total)"); n != 1 {
		t.Errorf("stop-time drop logged %d times, want 1", n)
	}
}
