package mq_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/polltest"
)

// TestRefusedLookupReplacesUnconsumedAnswer: a LOOKUP whose key decodes but
// is refused (world_size 0) answers 0 on the next poll of its request id,
// as a LOOKUP that starts no job does, instead of an older LOOKUP's hits
// for the same id that nobody consumed yet (those describe another prompt).
func TestRefusedLookupReplacesUnconsumedAnswer(t *testing.T) {
	_, _, sched, tokens := stored(t, 41, 4)
	k := key("m", 1, -1, tokens, 0, 4*testChunk, "q")
	if err := sched.Lookup(k, 1); err != nil {
		t.Fatal(err)
	}
	var n int
	var ready bool
	polltest.Until(t, 10*time.Second, "the first LOOKUP's job to finish", func() bool {
		var err error
		if n, ready, err = sched.QueryPrefetchLookupHits("q"); err != nil {
			t.Fatal(err)
		}
		return ready
	})
	if n != 4 {
		t.Fatalf("first LOOKUP hit %d chunks, want 4", n)
	}
	defer freeLocks(t, sched, k)

	bad := key("m", 1, -1, tokens, 0, 4*testChunk, "q")
	bad.WorldSize = 0
	if err := sched.Lookup(bad, 1); err != nil {
		t.Fatalf("refused LOOKUP reply: %v, want nil", err)
	}
	n, ready, err := sched.QueryPrefetchStatus("q")
	if err != nil {
		t.Fatal(err)
	}
	if !ready || n != 0 {
		t.Fatalf("QUERY_PREFETCH_STATUS after a refused LOOKUP = %d ready %v, want 0 ready (the older job's 4 hits must not answer it)", n, ready)
	}
}

// TestFailedRequestWarnThrottled: a peer whose requests keep failing the
// same way gets one "request failed" line per request type and 10 s, not one
// per request; another peer still gets its own line, and every request is
// still answered.
func TestFailedRequestWarnThrottled(t *testing.T) {
	h := start(t, opts{})
	h.worker(1, "m", 1, 0)
	a, b := h.dial(mqclient.Options{}), h.dial(mqclient.Options{})
	bad := key("m", 0, -1, prompt(1, testChunk), 0, testChunk, "r")
	for _, c := range []*mqclient.Client{a, a, a, b} {
		if err := c.Lookup(bad, 1); err != nil {
			t.Fatalf("refused LOOKUP reply: %v, want nil", err)
		}
	}
	// A LOOKUP answered on the socket goroutine sends its nil reply before
	// its work (and the failure's log line); a QUERY_PREFETCH_STATUS from
	// the same peer is handled on that goroutine after it, so its answer
	// means the LOOKUPs before it were logged or held back.
	for _, c := range []*mqclient.Client{a, b} {
		if n, ready, err := c.QueryPrefetchStatus("r"); err != nil || !ready || n != 0 {
			t.Fatalf("QUERY_PREFETCH_STATUS r = %d %v %v, want 0 ready (the refused LOOKUPs started no job)", n, ready, err)
		}
	}
	if n := strings.Count(h.logs.String(), "request failed"); n != 2 {
		t.Fatalf("%d \"request failed\" lines for 3 failures of one peer and 1 of another, want 2:\n%s", n, h.logs.String())
	}
}
