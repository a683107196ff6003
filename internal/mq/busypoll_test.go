package mq_test

import (
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mq"
)

// TestBusyPoll: with Config.BusyPoll the socket goroutine answers every
// request as it does blocking (NOOP, and LOOKUP then QUERY as vLLM sends
// them back to back) and counts the time it spun with nothing to read;
// without it nothing is counted. The spin's gain is a latency, measured
// in BENCHMARKS.md, not here.
func TestBusyPoll(t *testing.T) {
	for _, spin := range []time.Duration{0, 2 * time.Millisecond} {
		begin := time.Now()
		h := start(t, opts{mq: func(c *mq.Config) { c.BusyPoll = spin }})
		w := h.worker(1, "m", 1, 0)
		c := w.c
		for range 20 {
			if r, err := c.Noop(); err != nil || r != "OK" {
				t.Fatalf("busy poll %v: NOOP = %q, %v", spin, r, err)
			}
		}
		tokens := prompt(1, 3*testChunk)
		if n := w.store(tokens, 0, 2*testChunk, "bp-store", func(int) []byte { return nil }); n != 2 {
			t.Fatalf("busy poll %v: stored %d chunks, want 2", spin, n)
		}
		k := key("m", 1, -1, tokens, 0, 3*testChunk, "bp")
		lookupUntil(t, c, k, 2)
		if err := c.FreeLookupLocks(k, 1); err != nil {
			t.Fatal(err)
		}
		spun := func() float64 { return counterValue(h.srv.Metrics().ZMQBusyPollSeconds) }
		if spin == 0 {
			if got := spun(); got != 0 {
				t.Fatalf("no busy poll: %v s counted", got)
			}
			continue
		}
		// The spin is counted when it ends, BusyPoll after the last
		// reply, at the loop's next blocking poll.
		deadline := time.Now().Add(10 * time.Second)
		for spun() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("busy poll 2ms: nothing counted 10 s after the last request")
			}
			time.Sleep(time.Millisecond)
		}
		if got, wall := spun(), time.Since(begin).Seconds(); got > wall {
			t.Fatalf("busy poll: %v s counted in the server's %v s of wall time", got, wall)
		}
	}
}
