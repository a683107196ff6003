package coordinator

import (
	"math"
	"strings"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Tombstones: deletes that arrived before the store they undo.
//
// The cache-event stream has no order across emitters: Kafka records are
// keyed (partitioned) by instance_id, and over HTTP each server posts on
// its own. With a shared L2 bucket the eviction loop sends DELETE
// /cache/objects to a random server, so a key stored by instance A is
// often deleted by instance B. A coordinator that replays the stream (no
// checkpoint, a new group, a standby catching up) can read B's delete
// before A's store: the delete of a key the ledger does not hold changes
// nothing, the store then adds the key, and the ledger keeps an object that
// no longer exists (usage overcounted, and no delete event will ever come
// again to clear it).
//
// So a delete batch that carries ts (POST /events and Kafka records; the
// spec-era POST /quota/events has none and is unaffected) and removed fewer
// keys than it names leaves a tombstone per key: the newest delete ts seen
// for it. A later store batch of that key with ts <= the tombstone's is
// not applied (superseded: the delete happened after it); one with a newer
// ts is a real re-store, applied, and clears the tombstone.
//
// Why comparing ts across emitters is safe enough: ts is each emitter's
// wall clock. A store reordered behind its delete really happened before
// it, so with clocks closer than the store-to-delete interval (seconds to
// hours: a key is evicted only after the coordinator has seen it, and only
// once it is among its salt's least recently used) its ts is older and it
// is dropped, as it should be. Where the skew is larger than that interval
// the store looks newer and is applied: today's behaviour, never worse. The
// one way to lose a real store is a deleter clock ahead of the re-storer's
// by more than the delete-to-re-store interval while that re-store is
// read after the delete; the key is then missing from the ledger (usage
// undercounted) until it is stored again or a resync lists it.
//
// The set is bounded: at most tombstoneMax keys (the oldest dropped first)
// and none older than tombstoneTTL of event time (the newest ts seen), so
// a replay that never brings the store (it fell out of the topic's
// retention) cannot grow it forever. A store arriving after its tombstone
// was dropped is applied, as before this set existed. Batches whose ts is
// further than tombstoneTTL ahead of this coordinator's clock take no part
// (a broken emitter clock must not pin a tombstone or expire them all).
//
// The set is not in the checkpoint: a delete read before a checkpoint whose
// (older) store is read after it, on a partition that lagged at the
// checkpoint, is applied after a restart from that checkpoint.
const (
	tombstoneMax = 1_000_000
	tombstoneTTL = 3600.0 // seconds of event time
)

// tombstone is one deleted key and the newest ts it was deleted at.
type tombstone struct {
	key ledger.Key
	ts  float64
}

// tombstones is the bounded set. Its methods take mu; in practice they
// run under the event gate's lock already, so mu is never contended.
type tombstones struct {
	mu sync.Mutex
	m  map[ledger.Key]*eviction.Elem[tombstone]
	// order is by last update, the front the oldest.
	order eviction.List[tombstone]
	// newest is the event-time high-water mark: the largest ts observed.
	newest float64
	max    int
	ttl    float64
	now    func() time.Time
	// dropped counts tombstones dropped by reason (for metrics).
	droppedCapacity, droppedExpired uint64
}

func newTombstones() *tombstones {
	return &tombstones{m: map[ledger.Key]*eviction.Elem[tombstone]{}, max: tombstoneMax, ttl: tombstoneTTL, now: time.Now}
}

// usable reports whether a batch's ts may be compared: positive (0 is
// "unknown"; NaN fails too), finite, and not implausibly far ahead.
func (t *tombstones) usable(ts float64) bool {
	return ts > 0 && !math.IsInf(ts, 0) && ts <= float64(t.now().Unix())+t.ttl
}

func (t *tombstones) drop(e *eviction.Elem[tombstone]) {
	t.order.Remove(e)
	delete(t.m, e.Value.key)
}

// add records a new tombstone as the most recent.
func (t *tombstones) add(k ledger.Key, ts float64) {
	e := &eviction.Elem[tombstone]{Value: tombstone{key: k, ts: ts}}
	t.m[k] = e
	t.order.PushBack(e)
}

// observe advances event time to ts and expires what fell out of the
// window (from the head: an entry updated later sits behind, so one with
// an older ts may wait there until the cap or the head's expiry reaches
// it). Must hold mu.
func (t *tombstones) observe(ts float64) {
	if ts > t.newest {
		t.newest = ts
	}
	for f := t.order.Front(); f != nil && f.Value.ts < t.newest-t.ttl; f = t.order.Front() {
		t.drop(f)
		t.droppedExpired++
	}
}

// deleted records a tombstone at ts for every delete in events (a key
// already tombstoned keeps the newer ts).
func (t *tombstones) deleted(events []ledger.Event, ts float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observe(ts)
	for i := range events {
		k := events[i].Key
		if e, ok := t.m[k]; ok {
			if ts > e.Value.ts {
				e.Value.ts = ts
				t.order.PushBack(e) // moves it to the most recent end
			}
			continue
		}
		if ts < t.newest-t.ttl {
			continue // already expired
		}
		for len(t.m) >= t.max && t.order.Front() != nil {
			t.drop(t.order.Front())
			t.droppedCapacity++
		}
		// The decoded strings may share a request body: keep copies, so a
		// tombstone never pins a whole body for an hour.
		k.Model, k.Salt = strings.Clone(k.Model), strings.Clone(k.Salt)
		t.add(k, ts)
	}
}

// stored filters a store batch at ts: events whose key has a tombstone at
// or after ts are removed (compacted in place; the result aliases events)
// and counted; a newer store clears its tombstone. With no tombstones it
// costs one length check.
func (t *tombstones) stored(events []ledger.Event, ts float64) (kept []ledger.Event, superseded int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observe(ts)
	if len(t.m) == 0 {
		return events, 0
	}
	kept = events[:0]
	for i := range events {
		if e, ok := t.m[events[i].Key]; ok {
			if e.Value.ts >= ts {
				superseded++
				continue
			}
			t.drop(e)
		}
		kept = append(kept, events[i])
	}
	// The tail of events past kept keeps stale copies; the batch is not
	// read again after it is applied.
	return kept, superseded
}

// counts returns the live tombstones and the drops by reason.
func (t *tombstones) counts() (live int, capacity, expired uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m), t.droppedCapacity, t.droppedExpired
}

// appendCheckpoint writes the set oldest first, with the event-time mark.
// It is part of the checkpoint because a checkpoint can be taken while one
// partition lags another: a delete read from the one that ran ahead left a
// tombstone, and the older store behind the lagging partition's position is
// replayed after a restart, where only the tombstone refuses it.
func (t *tombstones) appendCheckpoint(e *checkpoint.Encoder) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.Uvarint(math.Float64bits(t.newest))
	e.Uvarint(uint64(len(t.m)))
	for x := t.order.Front(); x != nil; x = x.Next() {
		o := x.Value.key.ObjectKey()
		e.String(o.ChunkHash)
		e.String(o.ModelName)
		e.String(o.CacheSalt)
		e.Varint(o.KVRank)
		e.Varint(o.ObjectGroupID)
		e.Uvarint(math.Float64bits(x.Value.ts))
	}
}

// loadCheckpoint restores what appendCheckpoint wrote into an empty set and
// returns the number of tombstones; a malformed entry fails d.
func (t *tombstones) loadCheckpoint(d *checkpoint.Decoder) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	newest := math.Float64frombits(d.Uvarint())
	n := d.Count(10) // five strings' and numbers' length bytes at least, and the ts
	for i := 0; i < n && d.Err() == nil; i++ {
		var o objkey.Key
		o.ChunkHash = d.String()
		o.ModelName = d.String()
		o.CacheSalt = d.String()
		o.KVRank = d.Varint()
		o.ObjectGroupID = d.Varint()
		ts := math.Float64frombits(d.Uvarint())
		if d.Err() != nil {
			break
		}
		if math.IsNaN(ts) || math.IsInf(ts, 0) || ts <= 0 || o.ObjectGroupID < 0 {
			d.Failf("tombstone %d: ts %v, group %d", i, ts, o.ObjectGroupID)
			break
		}
		t.add(ledger.FromObjectKey(o), ts)
	}
	if math.IsNaN(newest) || math.IsInf(newest, 0) {
		d.Failf("tombstones' event time %v", newest)
	}
	t.newest = newest
	return len(t.m)
}
