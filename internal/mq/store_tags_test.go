package mq_test

import (
	"slices"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestStoresOfOneWorkerNeverShareABuffer: two PREPARE_STOREs of one
// worker whose prompts share a first chunk each get their own buffer for
// it. Reserved under one writer tag per worker, the second took over the
// first's buffer once the first's write lease ran out (here at once: a
// 1 ns lease), so the first request's late COMMIT or abort then published
// or freed a buffer the second worker was still writing into, and a freed
// buffer could be handed to another store under the second's copy.
func TestStoresOfOneWorkerNeverShareABuffer(t *testing.T) {
	h := start(t, opts{eng: func(c *engine.Config) { c.L1WriteTTL = time.Nanosecond }})
	w := h.worker(1, "m", 1, 0)
	p1 := prompt(51, 2*testChunk)
	p2 := slices.Concat(p1[:testChunk], prompt(52, testChunk))
	k1 := key("m", 1, 0, p1, 0, 2*testChunk, "r1")
	k2 := key("m", 1, 0, p2, 0, 2*testChunk, "r2")
	plan1, err := w.c.PrepareStore(k1, w.inst)
	if err != nil || len(plan1.Slots) != 2 {
		t.Fatalf("PREPARE_STORE r1 = %+v %v, want 2 slots", plan1, err)
	}
	plan2, err := w.c.PrepareStore(k2, w.inst)
	if err != nil || len(plan2.Slots) != 2 {
		t.Fatalf("PREPARE_STORE r2 = %+v %v, want 2 slots", plan2, err)
	}
	offsets := func(ss []wire.Slot) []wire.Int {
		var o []wire.Int
		for _, s := range ss {
			o = append(o, s.Offset)
		}
		return o
	}
	for _, off := range offsets(plan2.Slots) {
		if slices.Contains(offsets(plan1.Slots), off) {
			t.Fatalf("r2's slots %v share offset %d with r1's %v: two requests of one worker write one buffer", offsets(plan2.Slots), off, offsets(plan1.Slots))
		}
	}
	// Both leases ran out: both commits are refused, and nothing stays
	// staged (the harness checks at close).
	for _, k := range []*wire.Key{k1, k2} {
		if ok, err := w.c.CommitStore(k, w.inst, nil); err != nil || ok {
			t.Fatalf("COMMIT_STORE %s after its lease = %v %v, want false", k.RequestID, ok, err)
		}
	}
}
