// Package eventgate is the coordinator's admission stage for usage-event
// batches: one cursor per emitter stream decides whether a batch reaches
// the ledger.
//
// Two doors feed it. POST /events (newer upstream's unified cache-event
// stream, read from LMCache/LMCache lmcache/v1/mp_coordinator/ingest/
// event_gate.py at commit edb6145c) is gated: a lower incarnation is stale,
// a higher one fences the emitter's previous incarnation, a seq at or below
// the cursor is a duplicate, and a seq past cursor+1 marks a gap but is
// admitted. POST /quota/events (the spec-era door, whose batches carry no
// incarnation and whose replays upstream applies again) is only observed:
// gaps and regressions are counted, nothing is dropped.
//
// The two doors keep separate cursor maps: a spec-era seq and an /events
// seq of the same emitter are different counters, and mixing them would
// turn the first batch of one door into a "duplicate" of the other.
package eventgate

import (
	"strings"
	"sync"
)

// Verdict is what the gate did with one batch.
type Verdict uint8

// Verdicts. Only Admitted batches reach the state.
const (
	// Admitted: the batch was applied.
	Admitted Verdict = iota
	// Duplicate: same incarnation, seq at or below the cursor; dropped.
	Duplicate
	// Stale: an incarnation below the cursor's; dropped.
	Stale
)

// String is the verdict's metric label.
func (v Verdict) String() string {
	switch v {
	case Admitted:
		return "admitted"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	}
	return "unknown"
}

// Outcome is the gate's decision on one batch with the side facts the
// caller counts.
type Outcome struct {
	Verdict Verdict
	// Gap: the seq skipped ahead of cursor+1 (batches were lost); the
	// batch is still admitted.
	Gap bool
	// Fenced: the incarnation rose, so the emitter's previous incarnation
	// was fenced before this batch applied.
	Fenced bool
	// Replay (observed door only): the seq did not advance past the
	// previous batch's; the batch was applied anyway, as the spec says.
	Replay bool
	// Reset: the cursor map was full and was cleared before this batch
	// (dedup of every stream restarts from its next batch).
	Reset bool
}

// StreamStats is one emitter stream's cursor and counters.
type StreamStats struct {
	Incarnation int64 `json:"incarnation"`
	LastSeq     int64 `json:"last_seq"`
	GapDetected bool  `json:"gap_detected"`
	Applied     int64 `json:"applied"`
	Duplicates  int64 `json:"duplicates"`
	Stale       int64 `json:"stale"`
	Gaps        int64 `json:"gaps"`
	Fences      int64 `json:"fences"`
}

type cursor struct{ StreamStats }

// DefaultMaxStreams bounds each door's cursor map.
const DefaultMaxStreams = 100_000

// DefaultMaxStreamBytes bounds the instance-id bytes each door's cursor map
// keeps. Instance ids have no length limit (upstream's are plain strings,
// and a body may be 64 MiB), so the count bound alone would let ids of a
// mebibyte each pin 100 GB; real ids (a UUID, "mp-" and 32 hex digits) are
// about 40 bytes, 4 MB for DefaultMaxStreams of them.
const DefaultMaxStreamBytes = 16 << 20

// Gate holds the cursors. Safe for concurrent use: one mutex guards both
// maps and is held across the fence and apply callbacks, so one emitter's
// batches reach the state in admission order (as upstream). Callbacks must
// not call back into the gate.
type Gate struct {
	mu       sync.Mutex
	max      int
	maxBytes int
	gated    map[string]*cursor // POST /events streams
	legacy   map[string]*cursor // POST /quota/events streams
	// gatedBytes and legacyBytes are the bytes of the ids in each map.
	gatedBytes, legacyBytes int
}

// New returns an empty gate whose doors each track at most maxStreams
// emitters (DefaultMaxStreams when maxStreams <= 0).
func New(maxStreams int) *Gate {
	if maxStreams <= 0 {
		maxStreams = DefaultMaxStreams
	}
	return &Gate{max: maxStreams, maxBytes: DefaultMaxStreamBytes, gated: map[string]*cursor{}, legacy: map[string]*cursor{}}
}

// slot returns m's cursor for instance, creating it; idBytes is the bytes
// of m's ids. Past either bound (ids, their bytes) the whole map is cleared
// (reset reports it): arbitrary instance ids must not grow memory without
// limit, and forgetting every cursor only means each stream's next batch is
// admitted as a first batch.
func (g *Gate) slot(m map[string]*cursor, idBytes *int, instance string) (c *cursor, fresh, reset bool) {
	if c = m[instance]; c != nil {
		return c, false, false
	}
	if len(m) >= g.max || *idBytes+len(instance) > g.maxBytes {
		clear(m)
		*idBytes = 0
		reset = true
	}
	c = &cursor{}
	// Clone: instance may alias a pooled request buffer.
	m[strings.Clone(instance)] = c
	*idBytes += len(instance)
	return c, true, reset
}

// Offer decides one /events batch. When the incarnation rose, fence runs
// first (the previous incarnation's memory-resident facts are void); when
// the batch is admitted, apply runs. Both run under the gate's lock.
func (g *Gate) Offer(instance string, incarnation, seq int64, fence, apply func()) Outcome {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, fresh, reset := g.slot(g.gated, &g.gatedBytes, instance)
	out := Outcome{Reset: reset}
	if !fresh {
		switch {
		case incarnation < c.Incarnation:
			c.Stale++
			out.Verdict = Stale
			return out
		case incarnation > c.Incarnation:
			if fence != nil {
				fence()
			}
			out.Fenced = true
			// A fresh cursor for the new incarnation; the lifetime
			// counters stay with the stream.
			c.Fences++
			c.Incarnation, c.LastSeq, c.GapDetected = incarnation, 0, false
		case seq <= c.LastSeq:
			c.Duplicates++
			out.Verdict = Duplicate
			return out
		}
	} else {
		c.Incarnation = incarnation
	}
	if seq > c.LastSeq+1 {
		// Counted on every jump, flagged once per incarnation (upstream
		// warns once and keeps the flag until a replay).
		c.Gaps++
		c.GapDetected = true
		out.Gap = true
	}
	c.LastSeq = seq
	c.Applied++
	if apply != nil {
		apply()
	}
	return out
}

// Observe records one /quota/events batch, which the caller applies
// whatever the outcome (outside the gate's lock: the spec-era door promises
// no per-emitter order, and the ledger has its own lock). The cursor
// follows the latest seq (not the highest), so a restarted reporter
// counting again from 1 is one regression, not one per batch.
func (g *Gate) Observe(instance string, seq int64) Outcome {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, fresh, reset := g.slot(g.legacy, &g.legacyBytes, instance)
	out := Outcome{Reset: reset}
	if !fresh {
		switch {
		case seq > c.LastSeq+1:
			c.Gaps++
			c.GapDetected = true
			out.Gap = true
		case seq <= c.LastSeq:
			c.Duplicates++
			out.Replay = true
		}
	}
	c.LastSeq = seq
	c.Applied++
	return out
}

// Stats returns copies of the /events cursor and the /quota/events cursor
// of instance (nil where that door has seen none).
func (g *Gate) Stats(instance string) (gated, legacy *StreamStats) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.gated[instance]; c != nil {
		s := c.StreamStats
		gated = &s
	}
	if c := g.legacy[instance]; c != nil {
		s := c.StreamStats
		legacy = &s
	}
	return gated, legacy
}
