package coordinator

import (
	"net/http"
	"strconv"
	"sync"

	gojson "github.com/goccy/go-json"

	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Wire types for the POST /quota/events fast path, decoded with
// goccy/go-json (measured fastest of the candidates, see
// BENCHMARKS.md, coordinator). Strings and numbers are value types (a
// gojson.Number is the raw digits) so decoding allocates nothing per event;
// the price is that a missing field looks like an empty one. Real reporters
// never send empty values, so any empty, non-integer or otherwise invalid
// value sends the whole body to the generic validator (ingestSlow), which
// tells missing from empty, applies Pydantic's lax coercions and writes
// FastAPI's 422 detail with the exact location.
type wireKey struct {
	ChunkHashHex  string        `json:"chunk_hash_hex"`
	ModelName     string        `json:"model_name"`
	KVRank        gojson.Number `json:"kv_rank"`
	ObjectGroupID gojson.Number `json:"object_group_id"`
	CacheSalt     string        `json:"cache_salt"`
}

type wireEvent struct {
	Type  string        `json:"type"`
	Key   wireKey       `json:"key"`
	Bytes gojson.Number `json:"bytes"`
}

type wireBatch struct {
	InstanceID *string           `json:"instance_id"`
	Seq        *int64            `json:"seq"`
	Tier       gojson.RawMessage `json:"tier"` // raw, so null differs from absent

	Events *[]wireEvent `json:"events"`
}

// fastEvent converts one fast-path event; ok is false for anything the
// generic validator must look at.
func fastEvent(e *wireEvent) (ledger.Event, bool) {
	if e.Key.ChunkHashHex == "" || e.Key.ModelName == "" || e.Key.KVRank == "" || e.Bytes == "" {
		return ledger.Event{}, false
	}
	op, ok := ledger.ParseOp(e.Type)
	if !ok {
		return ledger.Event{}, false
	}
	n, err := strconv.ParseInt(string(e.Bytes), 10, 64)
	if err != nil || n < 0 {
		return ledger.Event{}, false
	}
	rank, err := strconv.ParseInt(string(e.Key.KVRank), 10, 64)
	if err != nil {
		return ledger.Event{}, false
	}
	var group int64
	if e.Key.ObjectGroupID != "" {
		if group, err = strconv.ParseInt(string(e.Key.ObjectGroupID), 10, 64); err != nil {
			return ledger.Event{}, false
		}
	}
	enc := objkey.Encoded{ChunkHashHex: e.Key.ChunkHashHex, ModelName: e.Key.ModelName, KVRank: rank, ObjectGroupID: group, CacheSalt: e.Key.CacheSalt}
	k, err := ledger.Prepare(&enc)
	if err != nil {
		return ledger.Event{}, false
	}
	return ledger.Event{Op: op, Key: k, Bytes: n}, true
}

// eventBufs recycles prepared-event slices between requests.
var eventBufs = sync.Pool{New: func() any { s := make([]ledger.Event, 0, 1024); return &s }}

// wireEventBufs recycles the slices the fast decoder decodes events into,
// zeroed, at full length. goccy decodes an array into a pooled scratch
// slice and copies the result into the destination, allocating a new one
// when the destination is too short, and allocates a zero element for
// every element past the destination's length: about 250 KB of garbage per
// 1,000-event batch, freshly mapped pages (and page faults) whenever the
// collector has handed it back to the kernel. Decoding over zeroed
// elements reads exactly as decoding into new ones. An absent "events"
// then leaves the zero elements in place, whose empty fields send the
// batch to the slow validator (which reports the missing field), as any
// empty value does; "events": null still clears the pointer.
var wireEventBufs = sync.Pool{New: func() any { s := make([]wireEvent, 1024); return &s }}

// maxPooledEvents bounds the wire-event slices kept for reuse (a batch
// that large is rare; its slice is left to the collector).
const maxPooledEvents = 16 << 10

// plainKeys reports whether the JSON text b is plain enough for the fast
// decoder to read it exactly as the validator would: ASCII only, no raw
// control character inside a string, and object keys without upper case or
// escapes. goccy (like encoding/json) matches field names
// case-insensitively, with Unicode folds (U+212A folds to k, U+017F to s),
// where the validator is exact, so "instAnCe_id" would be read as
// instance_id; and goccy accepts control characters in strings that JSON
// (and the validator) reject. Real reporters send plain ASCII with
// lower-case keys; anything else goes to the slow validator. Found by
// FuzzEventDecoders. Numbers with a leading zero, which goccy accepts and
// JSON does not, are refused too, and so is every backslash: goccy
// mis-reads malformed escapes (a backslash before the end of the body, an
// escape in a key where a value was expected) past the end of its buffer,
// an index-out-of-range panic or a read of whatever memory follows (found
// by FuzzEventDecoders), and real reporters send none.
func plainKeys(b []byte) bool {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c >= 0x80 || c == '\\' {
			return false
		}
		if c == '0' && i+1 < len(b) && b[i+1] >= '0' && b[i+1] <= '9' && intStart(b, i) {
			// A leading zero ("00", "-01"): invalid JSON that goccy
			// reads as a number. Found by FuzzCacheEventDecoders.
			return false
		}
		if c != '"' {
			continue
		}
		start := i + 1
		for i++; i < len(b); i++ {
			// One table load per byte: the loop runs over every string byte
			// of a batch (about a quarter of the decode's own time).
			if k := strByte[b[i]]; k != 0 {
				if k == badByte {
					return false
				}
				break // the closing quote
			}
		}
		if i >= len(b) {
			return false // unterminated: the slow validator words the error
		}
		j := i + 1
		for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
			j++
		}
		if j == len(b) || b[j] != ':' {
			continue // a string value, not a key
		}
		for _, c := range b[start:i] {
			if c >= 'A' && c <= 'Z' {
				return false
			}
		}
	}
	return true
}

// intStart reports whether b[i] (outside a string) begins the integer part
// of a number: not a digit's, fraction's or exponent's continuation.
func intStart(b []byte, i int) bool {
	j := i - 1
	if j >= 0 && b[j] == '-' {
		j--
		// "1e-05": exponent digits may have leading zeros.
		return j < 0 || b[j] != 'e' && b[j] != 'E'
	}
	return j < 0 || !(b[j] >= '0' && b[j] <= '9' || b[j] == '.' || b[j] == 'e' || b[j] == 'E' || b[j] == '+')
}

// strByte classifies bytes inside a JSON string for plainKeys: 0 plain,
// endByte for '"', badByte for control and non-ASCII bytes and '\\'.
var strByte = func() (t [256]byte) {
	for c := 0; c < 0x20; c++ {
		t[c] = badByte
	}
	for c := 0x80; c < 0x100; c++ {
		t[c] = badByte
	}
	t['"'], t['\\'] = endByte, badByte
	return t
}()

const (
	endByte = 1
	badByte = 2
)

// fastBatch is the fast decoder's verdict on a body: ok with the decoded
// batch, a definite rejection (err), or neither (defer to the slow
// validator).
type fastBatch struct {
	ok       bool
	err      error
	instance string
	seq      int64
	events   []ledger.Event
}

// decodeFast runs the goccy fast path over body, appending prepared events
// to buf. Decoded strings may alias body. It never applies anything.
func decodeFast(r *http.Request, body []byte, buf []ledger.Event) fastBatch {
	evp := wireEventBufs.Get().(*[]wireEvent)
	wire := *evp
	b := wireBatch{Events: &wire}
	defer func() {
		// The decoded strings alias body: drop them before pooling.
		clear(wire[:cap(wire)])
		if cap(wire) <= maxPooledEvents {
			*evp = wire[:cap(wire)]
		}
		wireEventBufs.Put(evp)
	}()
	if !jsonContentType(r) || !plainKeys(body) || gojson.UnmarshalNoEscape(body, &b) != nil || b.InstanceID == nil || b.Seq == nil || b.Events == nil {
		return fastBatch{events: buf}
	}
	if *b.Seq > maxSeq || len(*b.InstanceID) > maxInstanceIDBytes {
		return fastBatch{events: buf} // the slow validator words the 422
	}
	// Reporters send "l2" or nothing; anything else (null, l1, a typo,
	// an escaped string) is worded by the slow validator.
	if b.Tier != nil && string(b.Tier) != `"l2"` {
		return fastBatch{events: buf}
	}
	events := *b.Events
	for i := range events {
		ev, ok := fastEvent(&events[i])
		if !ok {
			return fastBatch{events: buf}
		}
		buf = append(buf, ev)
	}
	// Checked after the events: when "events" is absent, its zero elements
	// have sent the body to the slow validator above, which reports the
	// missing field beside this one.
	if *b.Seq < 1 {
		return fastBatch{events: buf, err: invalid(detailItem{Type: "greater_than_equal", Loc: []any{"body", "seq"}, Msg: "Input should be greater than or equal to 1", Input: *b.Seq, Ctx: map[string]any{"ge": 1}})}
	}
	return fastBatch{ok: true, instance: *b.InstanceID, seq: *b.Seq, events: buf}
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) error {
	// Refill leaves the CPU to the request meanwhile (ledger.refillYield).
	s.ledger.IngestStarted()
	defer s.ledger.IngestDone()
	buf, err := readPooledBody(w, r, eventsBodyLimit)
	if err != nil {
		return err
	}
	body := buf.Bytes()
	bufp := eventBufs.Get().(*[]ledger.Event)
	fb := decodeFast(r, body, (*bufp)[:0])
	defer func() { clear(fb.events); *bufp = fb.events[:0]; eventBufs.Put(bufp) }()
	if fb.err != nil {
		return fb.err // buf is not recycled: the error may quote it
	}
	if !fb.ok {
		// Validate the whole batch before applying anything: one bad event
		// rejects the batch and nothing is recorded (upstream applies the
		// events before a bad key and then answers 500).
		instance, seq, events, err := decodeSlow(r, body)
		if err != nil {
			return err
		}
		s.apply(instance, seq, events)
		bodyBufs.Put(buf)
		writeRecorded(w, len(events))
		return nil
	}
	s.apply(fb.instance, fb.seq, fb.events)
	// Decoded strings may alias buf; the ledger and the gate cloned what they
	// keep, and error paths (whose details may quote the body) never reach
	// here.
	bodyBufs.Put(buf)
	writeRecorded(w, len(fb.events))
	return nil
}

// apply records a validated batch: the ledger, the reporter's seq and the
// ingest metrics.
func (s *Server) apply(instance string, seq int64, events []ledger.Event) {
	c := s.ledger.Apply(events)
	s.observeSeq(instance, seq)
	m := s.metrics
	m.eventBatches.Inc()
	m.storeEvents.Add(float64(c.Store))
	m.lookupEvents.Add(float64(c.Lookup))
	m.deleteEvents.Add(float64(c.Delete))
}

func writeRecorded(w http.ResponseWriter, n int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"recorded":` + itoa(n) + `}`))
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

func evLoc(i int, rest ...any) []any { return append([]any{"body", "events", i}, rest...) }

// slowEvent is one event as the generic validator read it.
type slowEvent struct {
	typ   string
	key   objkey.Encoded
	bytes int64
}

// prepareSlowEvent checks the semantic rules (type, bytes >= 0, key
// invariants) and names the event index in every error.
func prepareSlowEvent(i int, e *slowEvent) (ledger.Event, error) {
	var items []detailItem
	op, ok := ledger.ParseOp(e.typ)
	if !ok {
		items = append(items, detailItem{Type: "literal_error", Loc: evLoc(i, "type"), Msg: "Input should be 'store', 'lookup' or 'delete'", Input: e.typ, Ctx: map[string]any{"expected": "'store', 'lookup' or 'delete'"}})
	}
	if e.bytes < 0 {
		items = append(items, detailItem{Type: "greater_than_equal", Loc: evLoc(i, "bytes"), Msg: "Input should be greater than or equal to 0", Input: e.bytes, Ctx: map[string]any{"ge": 0}})
	}
	if len(items) > 0 {
		return ledger.Event{}, invalid(items...)
	}
	k, err := ledger.Prepare(&e.key)
	if err != nil {
		msg := objkey.Reason(err)
		return ledger.Event{}, invalid(detailItem{Type: "value_error", Loc: evLoc(i, "key"), Msg: "Value error, event " + itoa(i) + ": " + msg, Input: e.key, Ctx: map[string]any{"error": msg}})
	}
	return ledger.Event{Op: op, Key: k, Bytes: e.bytes}, nil
}

// slowKey reads the key object of the event or entry ef (at loc). A
// missing or non-object key is recorded on ef; a field error inside the key
// is returned at once.
func slowKey(ef *fields, loc []any) (objkey.Encoded, error) {
	raw, ok := ef.m["key"]
	if !ok {
		ef.missing("key")
		return objkey.Encoded{}, nil
	}
	km, ok := raw.(map[string]any)
	if !ok {
		ef.fail("key", "model_attributes_type", "Input should be a valid dictionary or object to extract fields from", raw, nil)
		return objkey.Encoded{}, nil
	}
	kf := &fields{m: km, loc: append(append([]any{}, loc...), "key")}
	k := objkey.Encoded{ChunkHashHex: kf.str("chunk_hash_hex", true, ""), ModelName: kf.str("model_name", true, "")}
	k.KVRank, _ = kf.integer("kv_rank", true, 0)
	k.ObjectGroupID, _ = kf.integer("object_group_id", false, 0)
	k.CacheSalt = kf.str("cache_salt", false, "")
	return k, kf.err()
}

// maxSeq is the validator's upper bound on seq.
const maxSeq = 1 << 62

// decodeSlow re-validates a body the fast decoder refused, producing
// FastAPI-style detail; lax-mode inputs it accepts (e.g. "5" for an int)
// are returned for the same apply path. It never applies anything.
func decodeSlow(r *http.Request, body []byte) (string, int64, []ledger.Event, error) {
	f, err := parseObject(r, body)
	if err != nil {
		return "", 0, nil, err
	}
	instance := f.str("instance_id", true, "")
	f.tooLong("instance_id", instance, maxInstanceIDBytes)
	seq := f.intRange("seq", true, 1, 1, maxSeq)
	raw, ok := f.m["events"]
	var list []any
	if !ok {
		f.missing("events")
	} else if list, ok = raw.([]any); !ok {
		f.fail("events", "list_type", "Input should be a valid list", raw, nil)
	}
	if err := f.err(); err != nil {
		return "", 0, nil, err
	}
	if err := f.tier(); err != nil {
		return "", 0, nil, err
	}
	prepared := make([]ledger.Event, 0, len(list))
	for i, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			return "", 0, nil, invalid(detailItem{Type: "model_attributes_type", Loc: evLoc(i), Msg: "Input should be a valid dictionary or object to extract fields from", Input: item})
		}
		ef := &fields{m: m, loc: evLoc(i)}
		se := slowEvent{typ: ef.str("type", true, "")}
		se.bytes, _ = ef.integer("bytes", true, 0)
		key, err := slowKey(ef, evLoc(i))
		if err != nil {
			return "", 0, nil, err
		}
		se.key = key
		if err := ef.err(); err != nil {
			return "", 0, nil, err
		}
		ev, err := prepareSlowEvent(i, &se)
		if err != nil {
			return "", 0, nil, err
		}
		prepared = append(prepared, ev)
	}
	return instance, seq, prepared, nil
}
