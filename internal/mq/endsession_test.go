package mq_test

import (
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestEndSessionDropsSessionAndTouchesLRU: END_SESSION over the socket
// removes the request's session (active_sessions drops by one, the other
// requests' sessions stay) and refreshes the L1 recency of every chunk the
// session hashed, so the next eviction takes other objects first: prompt A
// (stored first, so least recent) survives a store that needs room, and
// prompt B, stored after it, is evicted instead. Ending the same request
// again is what an unknown one gets: a nil reply, the table unchanged.
func TestEndSessionDropsSessionAndTouchesLRU(t *testing.T) {
	// Four objects fit; the eviction loop never ticks, so only a store
	// that does not fit evicts (synchronously, least recent first).
	h := start(t, opts{eng: func(c *engine.Config) {
		c.L1SizeBytes = 4 * testObj
		c.EvictionInterval = time.Hour
	}})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	a, b, c := prompt(61, 2*testChunk), prompt(62, 2*testChunk), prompt(63, 2*testChunk)
	w.store(a, 0, 2*testChunk, "sa", data.of(61, 0))
	w.store(b, 0, 2*testChunk, "sb", data.of(62, 0))

	// Request "e" looks A up (its session holds A's hashes); "p" looks B
	// up after it, so B is the more recent either way.
	ka, kb := key("m", 1, -1, a, 0, 2*testChunk, "e"), key("m", 1, -1, b, 0, 2*testChunk, "p")
	lookupUntil(t, sched, ka, 2)
	freeLocks(t, sched, ka)
	lookupUntil(t, sched, kb, 2)
	freeLocks(t, sched, kb)
	if n := h.srv.Status().ActiveSessions; n != 4 {
		t.Fatalf("active_sessions = %d before END_SESSION, want 4 (sa, sb, e, p)", n)
	}

	if err := sched.EndSession("e"); err != nil {
		t.Fatal(err)
	}
	if n := h.srv.Status().ActiveSessions; n != 3 {
		t.Fatalf("active_sessions = %d after END_SESSION e, want 3", n)
	}
	if err := sched.EndSession("e"); err != nil {
		t.Fatalf("END_SESSION of an ended request: %v, want the nil reply", err)
	}
	if n := h.srv.Status().ActiveSessions; n != 3 {
		t.Fatalf("active_sessions = %d after a second END_SESSION e, want 3", n)
	}

	// C needs two objects' room: the two least recent go, B's.
	w.store(c, 0, 2*testChunk, "sc", data.of(63, 0))
	probe := func(name string, k *wire.Key, want int) {
		t.Helper()
		if got := lookupOnce(t, sched, k); got != want {
			t.Errorf("prompt %s: %d chunks resident after C's store, want %d", name, got, want)
		}
		freeLocks(t, sched, k)
	}
	probe("A", key("m", 1, -1, a, 0, 2*testChunk, "probe-a"), 2)
	probe("B", key("m", 1, -1, b, 0, 2*testChunk, "probe-b"), 0)
	probe("C", key("m", 1, -1, c, 0, 2*testChunk, "probe-c"), 2)
}
