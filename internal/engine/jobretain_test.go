package engine

import (
	"testing"
	"time"
)

// TestFinishedJobKeepsOnlyItsResult: a finished prefetch job waits up to
// 10 minutes for its poll (a fire-and-forget warm prefetch never polls),
// so once done it keeps only its result, not the request's keys and the
// per-key slices of its L1 and L2 phases; before, each unpolled job held
// all of them (hundreds of bytes per key) until the reaper dropped it.
func TestFinishedJobKeepsOnlyItsResult(t *testing.T) {
	fake := newFake("l2")
	h := start(t, Config{}, fake)
	defer h.stop(t)
	cs := chunks("", 0, 4, 2)
	h.mustPut(t, flat(cs[:2]))
	for _, k := range flat(cs[2:]) {
		fake.put(k, pattern(k, objSize))
	}
	if err := h.Prefetch(PrefetchRequest{ID: "warm", Chunks: cs, Sparse: true}); err != nil {
		t.Fatal(err)
	}
	h.pf.mu.Lock()
	j := h.pf.jobs["warm"]
	h.pf.mu.Unlock()
	select {
	case <-j.done:
	case <-time.After(time.Minute):
		t.Fatal("warm prefetch not done within a minute")
	}
	if j.req.Chunks != nil || j.hit != nil || j.flat != nil || j.chunkOf != nil || j.fromL1 != nil {
		t.Fatalf("finished job still holds %d chunks, %d hit flags, %d flat keys, %d chunk indices, %d L1 flags",
			len(j.req.Chunks), len(j.hit), len(j.flat), len(j.chunkOf), len(j.fromL1))
	}
	r, err := h.PollPrefetch("warm")
	if err != nil || !r.Done || r.PrefixChunks != 4 || r.TotalKeys != 8 || r.L1Keys != 4 || r.L2Keys != 4 {
		t.Fatalf("result %+v, %v; want done, 4 chunks, 8 keys (4 from L1, 4 from L2)", r, err)
	}
}
