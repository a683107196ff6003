package engine

import (
	"errors"
	"slices"
	"testing"
)

// TestUnpolledJobsBounded: past maxUnpolled finished jobs waiting for their
// poll, the oldest is discarded and counted in PrefetchReaped; a consumed
// job and a job replaced by a newer one of its id stop counting, so
// neither costs a waiting job its place.
func TestUnpolledJobsBounded(t *testing.T) {
	h := start(t, Config{})
	defer h.stop(t)
	h.pf.mu.Lock()
	h.pf.maxUnpolled = 3
	h.pf.mu.Unlock()
	cs := chunks("", 0, 1, 1)
	submit := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			// No adapters and nothing resident: the job finishes in
			// Prefetch, with 0 chunks.
			if err := h.Prefetch(PrefetchRequest{ID: id, Chunks: cs, Sparse: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waiting := func(want ...string) {
		t.Helper()
		for _, id := range []string{"a", "b", "c", "d", "e", "f", "g"} {
			_, err := h.PeekPrefetch(id)
			found := err == nil
			if found != slices.Contains(want, id) {
				t.Fatalf("job %s waiting = %v (err %v); want waiting %v", id, found, err, want)
			}
		}
	}
	submit("a", "b", "c", "d", "e")
	waiting("c", "d", "e")
	if n := h.Counters().PrefetchReaped; n != 2 {
		t.Fatalf("PrefetchReaped = %d after 5 unpolled jobs with room for 3, want 2", n)
	}
	if _, err := h.PollPrefetch("c"); err != nil {
		t.Fatal(err)
	}
	submit("f") // c was consumed: d, e, f wait
	waiting("d", "e", "f")
	submit("e") // replaces e: still d, e, f
	waiting("d", "e", "f")
	submit("g") // d is the oldest waiting
	waiting("e", "f", "g")
	if n := h.Counters().PrefetchReaped; n != 3 {
		t.Fatalf("PrefetchReaped = %d, want 3 (a, b, d)", n)
	}
	if _, err := h.PollPrefetch("d"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("poll of the discarded d: %v, want ErrNotFound", err)
	}
	h.pf.mu.Lock()
	h.pf.pruneFinishedLocked()
	unpolled, listed := h.pf.unpolled, len(h.pf.finished)
	h.pf.mu.Unlock()
	if unpolled != 3 || listed != 3 {
		t.Fatalf("after pruning: %d counted waiting, %d listed; want 3 and 3", unpolled, listed)
	}
}
