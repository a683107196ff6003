package mq_test

import "testing"

// TestPrepareRetrieveRetried: a PREPARE_RETRIEVE sent again for the same
// request (a worker retrying after a lost reply) is answered with the
// slots again and its one COMMIT_RETRIEVE succeeds and releases the
// lookup's lock: the retry replaces the pending read without releasing
// the lock the read still needs. The same range prepared for another
// request (the pending key leaves request_id out) still abandons the
// first request's read and releases its lock, before the chunks are
// checked, so a request without a lookup of its own is refused.
func TestPrepareRetrieveRetried(t *testing.T) {
	h, w, sched, tokens := stored(t, 71, 2)
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "r"), 2)
	rk := key("m", 1, 0, tokens, 0, 2*testChunk, "r")
	for try := range 2 {
		if ok, slots, err := w.c.PrepareRetrieve(rk, w.inst); err != nil || !ok || len(slots) != 2 {
			t.Fatalf("PREPARE_RETRIEVE try %d = ok %v, %d slots, %v; want 2 slots", try, ok, len(slots), err)
		}
	}
	if ok, err := w.c.CommitRetrieve(rk, w.inst); err != nil || !ok {
		t.Fatalf("COMMIT_RETRIEVE after a retried PREPARE = %v, %v; want true", ok, err)
	}
	if got := h.eng.Leaks(); len(got) != 0 {
		t.Fatalf("references left after the COMMIT_RETRIEVE: %v", got)
	}

	a, b := key("m", 1, -1, tokens, 0, 2*testChunk, "a"), key("m", 1, -1, tokens, 0, 2*testChunk, "b")
	lookupUntil(t, sched, a, 2)
	lookupUntil(t, sched, b, 2)
	for _, id := range []string{"a", "b"} {
		if ok, _, err := w.c.PrepareRetrieve(key("m", 1, 0, tokens, 0, 2*testChunk, id), w.inst); err != nil || !ok {
			t.Fatalf("PREPARE_RETRIEVE %s = %v, %v", id, ok, err)
		}
	}
	if ok, err := w.c.CommitRetrieve(key("m", 1, 0, tokens, 0, 2*testChunk, "b"), w.inst); err != nil || !ok {
		t.Fatalf("COMMIT_RETRIEVE b = %v, %v", ok, err)
	}
	if got := h.eng.Leaks(); len(got) != 0 {
		t.Fatalf("references left after b replaced a's pending read and committed: %v", got)
	}

	// A request that never looked up is not served under the lock of the
	// read it abandons: that lock goes first, and the chunks are then
	// unlocked for it.
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "d"), 2)
	if ok, _, err := w.c.PrepareRetrieve(key("m", 1, 0, tokens, 0, 2*testChunk, "d"), w.inst); err != nil || !ok {
		t.Fatalf("PREPARE_RETRIEVE d = %v, %v", ok, err)
	}
	if ok, slots, err := w.c.PrepareRetrieve(key("m", 1, 0, tokens, 0, 2*testChunk, "e"), w.inst); err != nil || ok {
		t.Fatalf("PREPARE_RETRIEVE of e, which never looked up = ok %v, %d slots, %v; want refused", ok, len(slots), err)
	}
	if got := h.eng.Leaks(); len(got) != 0 {
		t.Fatalf("references left after e abandoned d's pending read: %v", got)
	}
}
