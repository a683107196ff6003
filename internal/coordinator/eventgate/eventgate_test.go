package eventgate

import (
	"strconv"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOfferRules walks upstream's admission table: first batch admitted,
// replay duplicate, gap admitted and flagged, higher incarnation fences,
// lower incarnation stale.
func TestOfferRules(t *testing.T) {
	g := New(0)
	var applied, fenced int
	apply := func() { applied++ }
	fence := func() { fenced++ }
	steps := []struct {
		inc, seq int64
		want     Outcome
	}{
		{7, 1, Outcome{Verdict: Admitted}},
		{7, 2, Outcome{Verdict: Admitted}},
		{7, 2, Outcome{Verdict: Duplicate}},
		{7, 1, Outcome{Verdict: Duplicate}},
		{7, 5, Outcome{Verdict: Admitted, Gap: true}},
		{8, 1, Outcome{Verdict: Admitted, Fenced: true}},
		{7, 6, Outcome{Verdict: Stale}},
		{8, 1, Outcome{Verdict: Duplicate}},
		{8, 2, Outcome{Verdict: Admitted}},
	}
	for i, s := range steps {
		if got := g.Offer("mp-1", s.inc, s.seq, fence, apply); got != s.want {
			t.Fatalf("step %d (inc %d seq %d) = %+v, want %+v", i, s.inc, s.seq, got, s.want)
		}
	}
	if applied != 5 || fenced != 1 {
		t.Fatalf("applied %d fenced %d, want 5 and 1", applied, fenced)
	}
	st, legacy := g.Stats("mp-1")
	want := StreamStats{Incarnation: 8, LastSeq: 2, GapDetected: false, Applied: 5, Duplicates: 3, Stale: 1, Gaps: 1, Fences: 1}
	if legacy != nil || st == nil || *st != want {
		t.Fatalf("stats = %+v legacy %+v, want %+v", st, legacy, want)
	}
}

// TestFirstBatchPastOneIsGap: a fresh cursor starts at 0, so a stream first
// seen at seq 3 has lost two batches (upstream flags it the same way).
func TestFirstBatchPastOneIsGap(t *testing.T) {
	g := New(0)
	if got := g.Offer("a", 0, 3, nil, nil); got != (Outcome{Verdict: Admitted, Gap: true}) {
		t.Fatalf("got %+v", got)
	}
	if st, _ := g.Stats("a"); !st.GapDetected || st.LastSeq != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestObserveNeverDrops: the spec-era door counts replays and gaps but
// applies every batch.
func TestObserveNeverDrops(t *testing.T) {
	g := New(0)
	want := []Outcome{{}, {Replay: true}, {Gap: true}, {Replay: true}, {}}
	for i, seq := range []int64{1, 1, 4, 1, 2} {
		if got := g.Observe("s", seq); got != want[i] {
			t.Fatalf("batch %d seq %d = %+v, want %+v", i, seq, got, want[i])
		}
	}
	gated, legacy := g.Stats("s")
	if gated != nil || legacy == nil || legacy.Applied != 5 || legacy.Duplicates != 2 || legacy.Gaps != 1 || legacy.LastSeq != 2 {
		t.Fatalf("stats gated %+v legacy %+v", gated, legacy)
	}
}

// TestDoorsAreSeparate: the same emitter's /quota/events seq never makes
// its /events batch a duplicate.
func TestDoorsAreSeparate(t *testing.T) {
	g := New(0)
	g.Observe("x", 9)
	if got := g.Offer("x", 1, 1, nil, nil); got.Verdict != Admitted {
		t.Fatalf("got %+v", got)
	}
}

// TestBoundResets: past the bound the cursor map is cleared and the reset
// reported; the forgotten stream's next batch is admitted afresh.
func TestBoundResets(t *testing.T) {
	g := New(2)
	g.Offer("a", 1, 1, nil, nil)
	g.Offer("b", 1, 1, nil, nil)
	if got := g.Offer("c", 1, 1, nil, nil); !got.Reset || got.Verdict != Admitted {
		t.Fatalf("third stream = %+v", got)
	}
	if st, _ := g.Stats("a"); st != nil {
		t.Fatalf("a survived the reset: %+v", st)
	}
	if got := g.Offer("c", 1, 1, nil, nil); got.Verdict != Duplicate || got.Reset {
		t.Fatalf("c after reset = %+v", got)
	}
}

// TestConcurrentOffersApplyOnce: racing replays of one batch apply it once.
func TestConcurrentOffersApplyOnce(t *testing.T) {
	g := New(0)
	var mu sync.Mutex
	applied := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Offer("r", 3, 1, nil, func() { mu.Lock(); applied++; mu.Unlock() })
		}()
	}
	wg.Wait()
	if applied != 1 {
		t.Fatalf("applied %d times", applied)
	}
	if st, _ := g.Stats("r"); st.Duplicates != 15 {
		t.Fatalf("duplicates %d", st.Duplicates)
	}
}

// TestDefaultBoundBothDoors: New(0), as the coordinator builds its gate,
// lets each door hold exactly DefaultMaxStreams (100,000) instance ids:
// the 100,000th new id is no reset, the 100,001st is, on the gated and on
// the observed door alike (their maps are bounded separately).
func TestDefaultBoundBothDoors(t *testing.T) {
	if DefaultMaxStreams != 100_000 {
		t.Fatalf("DefaultMaxStreams = %d, the documented bound is 100,000", DefaultMaxStreams)
	}
	for _, d := range bothDoors(New(0)) {
		resets := 0
		for i := range 100_000 {
			if d.offer("id-" + strconv.Itoa(i)).Reset {
				resets++
			}
		}
		if resets != 0 {
			t.Fatalf("%s door: %d resets within 100,000 ids", d.door, resets)
		}
		if d.cursor("id-0") == nil {
			t.Fatalf("%s door: id-0 forgotten before the bound", d.door)
		}
		if got := d.offer("one-more"); !got.Reset {
			t.Fatalf("%s door: the 100,001st id = %+v, want a reset", d.door, got)
		}
		if st := d.cursor("id-0"); st != nil {
			t.Fatalf("%s door: id-0 survived the reset: %+v", d.door, st)
		}
	}
}

// gateDoor offers a first batch of an instance id to one of g's doors and
// reads its cursor there.
type gateDoor struct {
	door   string
	offer  func(id string) Outcome
	cursor func(id string) *StreamStats
}

func bothDoors(g *Gate) []gateDoor {
	return []gateDoor{
		{"gated", func(id string) Outcome { return g.Offer(id, 1, 1, nil, nil) }, func(id string) *StreamStats { s, _ := g.Stats(id); return s }},
		{"observed", func(id string) Outcome { return g.Observe(id, 1) }, func(id string) *StreamStats { _, s := g.Stats(id); return s }},
	}
}
