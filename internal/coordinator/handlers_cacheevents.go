package coordinator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/lmcache-go/lmcache/internal/coordinator/eventgate"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// POST /events: newer upstream's unified cache-event stream (read from
// LMCache/LMCache: lmcache/v1/mp_coordinator/api.py CacheEventBatch at
// 08340ea4, http_apis/events_api.py at 3dbad846, ingest/event_gate.py at
// edb6145c, docs/design/v1/mp_coordinator/ingest.md at c6bf05e3). The body
// is {"batches":[CacheEventBatch...]}; every batch goes through the event
// gate, and the reply counts batches: {"applied","duplicates","stale"}.
//
// Tier l2 batches feed the ledger (store sets a key's size, delete removes
// it, access refreshes its recency), exactly as the same events on
// /quota/events do. Tier l1 batches feed the per-instance L1 view, which a
// new incarnation fences. Config batches (capacity declarations) are
// validated and admitted but change nothing: this coordinator keeps no
// capacity view.

// unknownTokenOffset is upstream's UNKNOWN_TOKEN_OFFSET: the emitter did
// not report the chunk's position.
const unknownTokenOffset = -1

// cacheBatch is one validated CacheEventBatch.
type cacheBatch struct {
	instance           string
	incarnation, seq   int64
	typ, tier, backend string
	// ts is the batch's wall-clock time (0 when absent: such batches take
	// no part in the tombstone checks, see tombstones.go).
	ts float64
	// events holds the entries as ledger events (Op from typ); l1 and
	// config batches keep them too (config batches have none).
	events []ledger.Event
}

func batchLoc(i int, rest ...any) []any { return append([]any{"body", "batches", i}, rest...) }

func postInit(loc []any, input any, format string, a ...any) detailItem {
	msg := fmt.Sprintf(format, a...)
	return detailItem{Type: "value_error", Loc: loc, Msg: "Value error, " + msg, Input: input, Ctx: map[string]any{"error": msg}}
}

// laxBool applies Pydantic's lax bool rules.
func (f *fields) laxBool(name string) bool {
	v, ok := f.m[name]
	if !ok {
		return false
	}
	switch x := v.(type) {
	case bool:
		return x
	case json.Number:
		switch x {
		case "0":
			return false
		case "1":
			return true
		}
	case string:
		switch strings.ToLower(x) {
		case "0", "off", "f", "false", "n", "no":
			return false
		case "1", "on", "t", "true", "y", "yes":
			return true
		}
	}
	f.fail(name, "bool_parsing", "Input should be a valid boolean", v, nil)
	return false
}

var cacheEventOps = map[string]ledger.Op{"store": ledger.OpStore, "delete": ledger.OpDelete, "access": ledger.OpLookup, "config": 0}

// decodeCacheEntry validates entries[j] of batch i.
func decodeCacheEntry(i, j int, item any, op ledger.Op) (ledger.Event, error) {
	loc := batchLoc(i, "entries", j)
	m, ok := item.(map[string]any)
	if !ok {
		return ledger.Event{}, invalid(detailItem{Type: "dataclass_type", Loc: loc, Msg: "Input should be a dictionary or an instance of CacheEventEntry", Input: item})
	}
	ef := &fields{m: m, loc: loc}
	enc, err := slowKey(ef, loc)
	if err != nil {
		return ledger.Event{}, err
	}
	size, _ := ef.integer("size_bytes", false, 0)
	ef.intList("token_ids")
	offset, _ := ef.integer("token_offset", false, unknownTokenOffset)
	if err := ef.err(); err != nil {
		return ledger.Event{}, err
	}
	switch {
	case size < 0:
		return ledger.Event{}, invalid(postInit(loc, m, "size_bytes must be >= 0 (got %d)", size))
	case offset < 0 && offset != unknownTokenOffset:
		return ledger.Event{}, invalid(postInit(loc, m, "token_offset must be >= 0 or UNKNOWN_TOKEN_OFFSET (%d), got %d", unknownTokenOffset, offset))
	}
	k, err := ledger.Prepare(&enc)
	if err != nil {
		msg := objkey.Reason(err)
		return ledger.Event{}, invalid(detailItem{Type: "value_error", Loc: append(loc, "key"), Msg: "Value error, " + msg, Input: m["key"], Ctx: map[string]any{"error": msg}})
	}
	return ledger.Event{Op: op, Key: k, Bytes: size}, nil
}

// decodeCacheBatch validates batches[i] with CacheEventBatch's field types
// and __post_init__ invariants.
func decodeCacheBatch(i int, item any) (cacheBatch, error) {
	loc := batchLoc(i)
	m, ok := item.(map[string]any)
	if !ok {
		return cacheBatch{}, invalid(detailItem{Type: "dataclass_type", Loc: loc, Msg: "Input should be a dictionary or an instance of CacheEventBatch", Input: item})
	}
	f := &fields{m: m, loc: loc}
	b := cacheBatch{instance: f.str("instance_id", true, "")}
	f.tooLong("instance_id", b.instance, maxInstanceIDBytes)
	b.incarnation, _ = f.integer("incarnation", true, 0)
	b.seq, _ = f.integer("seq", true, 0)
	b.typ = f.str("event_type", true, "")
	b.tier = f.str("tier", true, "")
	b.backend = f.str("backend", true, "")
	f.laxBool("shared")
	ts, _, _ := f.number("ts", false, false)
	capBytes, _ := f.integer("capacity_bytes", false, 0)
	capRev, _ := f.integer("capacity_revision", false, 0)
	var list []any
	if raw, present := m["entries"]; present {
		if list, ok = raw.([]any); !ok {
			f.fail("entries", "list_type", "Input should be a valid list", raw, nil)
		}
	}
	op, known := cacheEventOps[b.typ]
	if _, present := m["event_type"]; present && !known && len(f.errs) == 0 {
		f.fail("event_type", "enum", "Input should be 'store', 'delete', 'access' or 'config'", m["event_type"], map[string]any{"expected": "'store', 'delete', 'access' or 'config'"})
	}
	if _, present := m["tier"]; present && b.tier != "l1" && b.tier != "l2" && b.tier != "all" && len(f.errs) == 0 {
		f.fail("tier", "enum", "Input should be 'l1', 'l2' or 'all'", m["tier"], map[string]any{"expected": "'l1', 'l2' or 'all'"})
	}
	if err := f.err(); err != nil {
		return cacheBatch{}, err
	}
	// __post_init__, in upstream's order.
	switch {
	case b.instance == "":
		return cacheBatch{}, invalid(postInit(loc, m, "instance_id must be non-empty"))
	case b.backend == "" && b.typ != "access":
		return cacheBatch{}, invalid(postInit(loc, m, "backend must be non-empty for %s batches", b.typ))
	case b.typ == "config" && len(list) > 0:
		return cacheBatch{}, invalid(postInit(loc, m, "config batches declare capacity and carry no entries"))
	case capBytes < 0:
		return cacheBatch{}, invalid(postInit(loc, m, "capacity_bytes must be >= 0 (got %d)", capBytes))
	case capRev < 0:
		return cacheBatch{}, invalid(postInit(loc, m, "capacity_revision must be >= 0 (got %d)", capRev))
	case b.incarnation < 0:
		return cacheBatch{}, invalid(postInit(loc, m, "incarnation must be >= 0 (got %d)", b.incarnation))
	case b.seq < 1:
		return cacheBatch{}, invalid(postInit(loc, m, "seq must be >= 1 (got %d)", b.seq))
	case b.tier == "all":
		return cacheBatch{}, invalid(postInit(loc, m, "cache events must target a concrete tier (got 'all')"))
	case ts < 0:
		return cacheBatch{}, invalid(postInit(loc, m, "ts must be >= 0 (got %v)", ts))
	}
	b.ts = ts
	b.events = make([]ledger.Event, 0, len(list))
	for j, e := range list {
		ev, err := decodeCacheEntry(i, j, e, op)
		if err != nil {
			return cacheBatch{}, err
		}
		b.events = append(b.events, ev)
	}
	return b, nil
}

// decodeCacheEvents validates a whole POST /events body. It never applies
// anything: one bad batch or entry rejects the request.
func decodeCacheEvents(r *http.Request, body []byte) ([]cacheBatch, error) {
	f, err := parseObject(r, body)
	if err != nil {
		return nil, err
	}
	raw, present := f.m["batches"]
	if !present {
		return nil, nil // Field(default_factory=list)
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, invalid(detailItem{Type: "list_type", Loc: []any{"body", "batches"}, Msg: "Input should be a valid list", Input: raw})
	}
	out := make([]cacheBatch, 0, len(list))
	for i, item := range list {
		b, err := decodeCacheBatch(i, item)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func (s *Server) handleCacheEvents(w http.ResponseWriter, r *http.Request) error {
	s.ledger.IngestStarted() // see handleEvents
	defer s.ledger.IngestDone()
	body, err := readBody(w, r, eventsBodyLimit)
	if err != nil {
		return err
	}
	batches, err := decodeAnyCacheEvents(r, body)
	if err != nil {
		return err
	}
	var res CacheEventsResponse
	// Batches are offered in list order, as upstream: per emitter they
	// must arrive in emission order.
	for i := range batches {
		switch s.offer(&batches[i]) {
		case eventgate.Admitted:
			res.Applied++
		case eventgate.Duplicate:
			res.Duplicates++
		case eventgate.Stale:
			res.Stale++
		}
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// offer runs one validated batch through the gate and, when admitted,
// applies it.
func (s *Server) offer(b *cacheBatch) eventgate.Verdict {
	m := s.metrics
	fence := func() {
		// The emitter restarted: its memory is empty, so the L1 facts of
		// the previous incarnation are void. L2 objects outlive the
		// process and leave only through delete events.
		n := s.l1.fence(b.instance)
		m.gateFences.Inc()
		m.l1FactsFenced.Add(float64(n))
		s.log.Info("event stream fenced: new incarnation", "instance_id", b.instance, "incarnation", b.incarnation, "l1_facts_dropped", n)
	}
	out := s.gate.Offer(b.instance, b.incarnation, b.seq, fence, func() { s.applyCacheBatch(b) })
	s.countReset(out)
	m.gateBatches.WithLabelValues(doorEvents, out.Verdict.String()).Inc()
	if out.Gap {
		m.gateGaps.WithLabelValues(doorEvents).Inc()
		s.log.Warn("event gap: seq jumped; batches were lost", "instance_id", b.instance, "incarnation", b.incarnation, "seq", b.seq)
	}
	return out.Verdict
}

// applyCacheBatch applies an admitted batch (under the gate's lock).
func (s *Server) applyCacheBatch(b *cacheBatch) {
	if b.typ == "config" {
		return
	}
	if b.tier == "l2" {
		m := s.metrics
		events, tsOK := b.events, s.tombs.usable(b.ts)
		if tsOK && b.typ == "store" {
			var n int
			events, n = s.tombs.stored(events, b.ts)
			m.superseded.Add(float64(n))
		}
		// A delete batch with deletes of keys the ledger does not hold
		// (yet) tombstones its keys. Which ones missed is not reported,
		// so all are; a tombstone of a key that was held only refuses
		// stores older than this delete, which this delete undid anyway.
		c := s.ledger.Apply(events)
		if tsOK && b.typ == "delete" && c.DeleteMissed > 0 {
			s.tombs.deleted(events, b.ts)
		}
		m.eventBatches.Inc()
		m.storeEvents.Add(float64(c.Store))
		m.lookupEvents.Add(float64(c.Lookup))
		m.deleteEvents.Add(float64(c.Delete))
		return
	}
	for _, ev := range b.events {
		switch ev.Op {
		case ledger.OpStore:
			if !s.l1.store(b.instance, ev.Key, ev.Bytes) {
				s.metrics.l1FactsDropped.Inc()
			}
		case ledger.OpDelete:
			s.l1.remove(b.instance, ev.Key)
		}
	}
}
