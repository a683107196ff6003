// Package kafkaevents carries the coordinator's cache-event stream over Kafka,
// interchangeably with upstream LMCache's KafkaCacheEventSink (MP server side)
// and KafkaCacheEventSource (coordinator side): one record per batch, keyed by
// the emitter's instance_id, whose value is the POST /events body
// {"batches":[batch]} as compact JSON. Records carry no headers.
//
// The Sink produces with an idempotent producer, acks=all and a delivery
// timeout; the Source consumes a topic in a consumer group from the earliest
// offset and commits an offset only after its Applier accepted the record
// (at-least-once; the coordinator's event gate deduplicates by seq).
package kafkaevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Defaults shared with upstream (its sink and source configs).
const (
	// DefaultTopic is upstream's default topic for both the MP servers'
	// --coordinator-kafka-topic and the coordinator's --kafka-topic.
	DefaultTopic = "lmcache-cache-events"
	// DefaultGroupID is upstream's default for the coordinator's
	// --kafka-group-id.
	DefaultGroupID = "lmcache-coordinator"
	// UnknownTokenOffset is the token_offset of an entry whose emitter did not
	// report a position (distinct from 0, a real position).
	UnknownTokenOffset = -1
)

// ErrUndecodable marks a record whose value is not a valid cache-event
// envelope. Such records are skipped and counted, as upstream does.
var ErrUndecodable = errors.New("undecodable cache-event record")

// Event types and tiers a batch may carry.
const (
	EventStore  = "store"
	EventDelete = "delete"
	EventAccess = "access"
	EventConfig = "config"
	TierL1      = "l1"
	TierL2      = "l2"
)

// Entry is one key's change inside a Batch (upstream CacheEventEntry). Field
// order is upstream's so that our JSON matches its pydantic output.
type Entry struct {
	Key         objkey.Encoded `json:"key"`
	SizeBytes   int64          `json:"size_bytes"`
	TokenIDs    []int64        `json:"token_ids"`
	TokenOffset int64          `json:"token_offset"`
}

// Batch is a batch of same-typed cache events from one emitter (upstream
// CacheEventBatch). Field order is upstream's.
type Batch struct {
	InstanceID       string  `json:"instance_id"`
	Incarnation      int64   `json:"incarnation"`
	Seq              int64   `json:"seq"`
	EventType        string  `json:"event_type"`
	Tier             string  `json:"tier"`
	Backend          string  `json:"backend"`
	Entries          []Entry `json:"entries"`
	Shared           bool    `json:"shared"`
	TS               PyFloat `json:"ts"`
	CapacityBytes    int64   `json:"capacity_bytes"`
	CapacityRevision int64   `json:"capacity_revision"`
}

// Envelope is a record's value: the POST /events body.
type Envelope struct {
	Batches []Batch `json:"batches"`
}

// PyFloat is a float64 that marshals the way pydantic does for the values a
// wall-clock timestamp takes: integral values keep a ".0" (0.0, not 0).
type PyFloat float64

// MarshalJSON writes f in Python's shortest round-trip form.
func (f PyFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, fmt.Errorf("kafkaevents: ts %v is not finite", v)
	}
	if v != 0 && (math.Abs(v) >= 1e16 || math.Abs(v) < 1e-4) {
		return []byte(strconv.FormatFloat(v, 'e', -1, 64)), nil
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !bytes.ContainsAny([]byte(s), ".e") {
		s += ".0"
	}
	return []byte(s), nil
}

// wireEntry and wireBatch decode with presence checks: upstream's dataclasses
// make these fields required, so a record missing one is undecodable there.
type wireEntry struct {
	Key         *wireKey `json:"key"`
	SizeBytes   *int64   `json:"size_bytes"`
	TokenIDs    []int64  `json:"token_ids"`
	TokenOffset *int64   `json:"token_offset"`
}

type wireKey struct {
	ChunkHashHex  *string `json:"chunk_hash_hex"`
	ModelName     *string `json:"model_name"`
	KVRank        *int64  `json:"kv_rank"`
	ObjectGroupID int64   `json:"object_group_id"`
	CacheSalt     string  `json:"cache_salt"`
}

type wireBatch struct {
	InstanceID       *string     `json:"instance_id"`
	Incarnation      *int64      `json:"incarnation"`
	Seq              *int64      `json:"seq"`
	EventType        *string     `json:"event_type"`
	Tier             *string     `json:"tier"`
	Backend          *string     `json:"backend"`
	Entries          []wireEntry `json:"entries"`
	Shared           bool        `json:"shared"`
	TS               float64     `json:"ts"`
	CapacityBytes    int64       `json:"capacity_bytes"`
	CapacityRevision int64       `json:"capacity_revision"`
}

// Encode returns the record value for one batch: {"batches":[b]}.
func Encode(b Batch) ([]byte, error) {
	if b.Entries == nil {
		b.Entries = []Entry{}
	}
	for i := range b.Entries {
		if b.Entries[i].TokenIDs == nil {
			b.Entries[i].TokenIDs = []int64{}
		}
	}
	out, err := json.Marshal(Envelope{Batches: []Batch{b}})
	if err != nil {
		return nil, fmt.Errorf("kafkaevents: encode batch: %w", err)
	}
	return out, nil
}

// Decode parses and validates a record value. Every batch must satisfy
// upstream's CacheEventBatch invariants and every entry key must convert to an
// object key; otherwise the whole record is undecodable (ErrUndecodable), as a
// pydantic ValidationError makes it upstream.
func Decode(value []byte) (Envelope, error) {
	var w struct {
		Batches []wireBatch `json:"batches"`
	}
	if err := json.Unmarshal(value, &w); err != nil {
		return Envelope{}, fmt.Errorf("%w: %w", ErrUndecodable, err)
	}
	env := Envelope{Batches: make([]Batch, 0, len(w.Batches))}
	for i, wb := range w.Batches {
		b, err := wb.batch()
		if err != nil {
			return Envelope{}, fmt.Errorf("%w: batches[%d]: %w", ErrUndecodable, i, err)
		}
		env.Batches = append(env.Batches, b)
	}
	return env, nil
}

func (wb wireBatch) batch() (Batch, error) {
	for _, f := range []struct {
		name    string
		present bool
	}{
		{"instance_id", wb.InstanceID != nil}, {"incarnation", wb.Incarnation != nil},
		{"seq", wb.Seq != nil}, {"event_type", wb.EventType != nil},
		{"tier", wb.Tier != nil}, {"backend", wb.Backend != nil},
	} {
		if !f.present {
			return Batch{}, fmt.Errorf("field %s is required", f.name)
		}
	}
	b := Batch{
		InstanceID: *wb.InstanceID, Incarnation: *wb.Incarnation, Seq: *wb.Seq,
		EventType: *wb.EventType, Tier: *wb.Tier, Backend: *wb.Backend,
		Entries: make([]Entry, 0, len(wb.Entries)), Shared: wb.Shared, TS: PyFloat(wb.TS),
		CapacityBytes: wb.CapacityBytes, CapacityRevision: wb.CapacityRevision,
	}
	for j, we := range wb.Entries {
		e, err := we.entry()
		if err != nil {
			return Batch{}, fmt.Errorf("entries[%d]: %w", j, err)
		}
		b.Entries = append(b.Entries, e)
	}
	return b, b.Validate()
}

func (we wireEntry) entry() (Entry, error) {
	if we.Key == nil || we.Key.ChunkHashHex == nil || we.Key.ModelName == nil || we.Key.KVRank == nil {
		return Entry{}, errors.New("key with chunk_hash_hex, model_name and kv_rank is required")
	}
	e := Entry{
		Key: objkey.Encoded{ChunkHashHex: *we.Key.ChunkHashHex, ModelName: *we.Key.ModelName,
			KVRank: *we.Key.KVRank, ObjectGroupID: we.Key.ObjectGroupID, CacheSalt: we.Key.CacheSalt},
		TokenIDs:    we.TokenIDs,
		TokenOffset: UnknownTokenOffset,
	}
	if e.TokenIDs == nil {
		e.TokenIDs = []int64{}
	}
	if we.SizeBytes != nil {
		e.SizeBytes = *we.SizeBytes
	}
	if we.TokenOffset != nil {
		e.TokenOffset = *we.TokenOffset
	}
	return e, nil
}

// Validate checks upstream's CacheEventBatch and CacheEventEntry invariants
// and that every key converts to an object key.
func (b Batch) Validate() error {
	switch {
	case b.InstanceID == "":
		return errors.New("instance_id must be non-empty")
	case b.EventType != EventStore && b.EventType != EventDelete && b.EventType != EventAccess && b.EventType != EventConfig:
		return fmt.Errorf("event_type %q is not one of store, delete, access, config", b.EventType)
	case b.Tier != TierL1 && b.Tier != TierL2:
		return fmt.Errorf("tier %q is not l1 or l2", b.Tier)
	case b.Backend == "" && b.EventType != EventAccess:
		return fmt.Errorf("backend must be non-empty for %s batches", b.EventType)
	case b.EventType == EventConfig && len(b.Entries) > 0:
		return errors.New("config batches carry no entries")
	case b.CapacityBytes < 0:
		return fmt.Errorf("capacity_bytes must be >= 0 (got %d)", b.CapacityBytes)
	case b.CapacityRevision < 0:
		return fmt.Errorf("capacity_revision must be >= 0 (got %d)", b.CapacityRevision)
	case b.Incarnation < 0:
		return fmt.Errorf("incarnation must be >= 0 (got %d)", b.Incarnation)
	case b.Seq < 1:
		return fmt.Errorf("seq must be >= 1 (got %d)", b.Seq)
	case b.TS < 0 || math.IsNaN(float64(b.TS)) || math.IsInf(float64(b.TS), 0):
		return fmt.Errorf("ts must be a finite value >= 0 (got %v)", float64(b.TS))
	}
	for i, e := range b.Entries {
		if e.SizeBytes < 0 {
			return fmt.Errorf("entries[%d]: size_bytes must be >= 0 (got %d)", i, e.SizeBytes)
		}
		if e.TokenOffset < 0 && e.TokenOffset != UnknownTokenOffset {
			return fmt.Errorf("entries[%d]: token_offset must be >= 0 or -1 (got %d)", i, e.TokenOffset)
		}
		if _, err := e.Key.Decode(); err != nil {
			return fmt.Errorf("entries[%d]: key: %w", i, err)
		}
	}
	return nil
}
