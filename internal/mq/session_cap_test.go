package mq_test

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
)

// TestSessionsBoundedLRU: past MaxSessions the least recently used request
// session is dropped and counted; a session a request used again is kept.
// With a cap of 2, after the store of "s" and LOOKUPs of a, b, a, c, a the
// open sessions are {a, c}: s went for b, b went for c (a was used after
// it), and the last LOOKUP of a finds its session, so two were dropped. A
// first-in-first-out cap would have dropped a for c and a third for the
// last a.
func TestSessionsBoundedLRU(t *testing.T) {
	if got := mq.Defaults().MaxSessions; got != 16384 {
		t.Fatalf("default MaxSessions = %d, want 16384", got)
	}
	h := start(t, opts{mq: func(c *mq.Config) { c.MaxSessions = 2 }})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	tokens := prompt(43, 2*testChunk)
	w.store(tokens, 0, 2*testChunk, "s", chunkData{}.of(43, 0))

	ids := []string{"a", "b", "a", "c", "a"}
	for _, id := range ids {
		if n := lookupOnce(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, id)); n != 2 {
			t.Fatalf("LOOKUP %s hit %d chunks, want 2", id, n)
		}
	}
	evicted := counterValue(h.srv.Metrics().ZMQEvictedSessions)
	active := h.srv.Status().ActiveSessions
	for _, id := range ids {
		freeLocks(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, id))
	}
	if evicted != 2 || active != 2 {
		t.Fatalf("after s, a, b, a, c, a with MaxSessions 2: %v sessions evicted, %d open; want 2 evicted, 2 open", evicted, active)
	}
}
