// Package ledger is the coordinator's L2 accounting: per-key sizes, per-salt
// usage, a per-salt LRU order, pin reference counts and the eviction planner.
//
// It is built for tens of millions of keys: model names and salts are
// interned to 32-bit ids, chunk hashes of up to 32 bytes are stored inline,
// entries live in fixed-size pages (no giant reallocations) linked into
// per-salt LRU lists by 32-bit indices, and the key index is an
// open-addressing table of 64-bit slots (a 32-bit hash tag and a 32-bit
// entry index). One mutex guards everything: every operation is short, and
// a whole event batch is applied under one acquisition.
//
// No ingest step under the lock is proportional to the number of keys: the
// index grows incrementally (see startGrow), entry pages are allocated 65,536
// entries at a time, and freed entries form a list threaded through the
// entries themselves, so no request pauses while the ledger doubles. The
// memory the next growth step needs (an entry page, the next index table)
// is allocated and faulted in ahead by Refill, off the lock (see
// reserve.go), so ingest does not wait for the kernel to map pages either.
package ledger

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

const (
	nilIdx    = math.MaxUint32
	pageBits  = 16
	pageSize  = 1 << pageBits
	inlineMax = 32
	longHash  = 0xFF // hlen marker: hash[0:4] holds an id into Ledger.longs
	tagMask   = ^uint64(0xFFFFFFFF)

	// migrateStep is how many slots of the old index every store and
	// delete moves into the new one while the index grows. A table of S
	// slots grows when 3/4 full; its 2S successor grows only after 3S/4
	// more new keys, each a store that migrates migrateStep slots, so any
	// step of 2 or more (S/2 stores) ends every migration before the next
	// can start. 8 ends it after S/8 stores, so the old table goes soon,
	// while the extra work per event stays at 8 slots.
	migrateStep = 8

	// prefaultStep is how many slots of the next index every store
	// prefaults (writes, so the kernel maps the page) before growth starts.
	// Inserts land anywhere in a new table, so without this the first
	// batches after a doubling fault on a fresh page for nearly every key,
	// twice (Apply's read maps the zero page, the store copies it), which
	// measured 4-7 ms per 1,000-event batch on the development VM (about
	// 18 us per fault). The next table is allocated when the index is 5/8
	// full and needs 2*len/prefaultStep stores to prefault, half of the 1/8
	// of len left until growth at 3/4, so it is resident in time; a store
	// faults at most one page, one store in 16 does. The price is memory:
	// from 5/8 to 3/4 full the index takes three times its size (about 24
	// more bytes per key).
	prefaultStep = 32
	pageSlots    = 4096 / 8

	// mapSlots is the smallest table taken straight from the kernel (see
	// newTable); releaseSlots is the chunk of a migrated table handed back
	// at a time: one huge page, so a release never splits one.
	mapSlots     = 1 << 17
	releaseSlots = hugePage / 8

	// hugePage is the size of a transparent huge page on amd64 and arm64
	// Linux, which slabs are aligned to and ask for (see mapSlab).
	hugePage = 2 << 20
)

// slab is memory mapped from the kernel rather than the Go heap: an index
// table, or an entry page. The Go allocator zeroes a large object whose
// memory it reuses, all at once: 351 ms for a 256 MiB table on the
// development VM, under the ledger lock. Fresh anonymous memory is zero
// already and the kernel maps it page by page as it is first written
// (by Refill, or by prefault). A table's slab is unmapped when its
// migration ends; any slab is unmapped by its cleanup once the Ledger that
// held it is dropped.
//
// Slabs are aligned to hugePage and marked MADV_HUGEPAGE, so where the
// kernel allows transparent huge pages ("madvise" or "always" in
// /sys/kernel/mm/transparent_hugepage/enabled) they are backed by 2 MiB
// pages. Apply's loads land on random entries and index slots spread
// over gigabytes at tens of millions of keys, nearly every one a TLB miss
// with 4 KiB pages; with 2 MiB pages the same memory needs 512 times fewer
// translations. On the paravirtualized (PVM) development VM, where a
// translation the hypervisor must rebuild is expensive, three alternating
// runs to 20M keys had 53-136 requests over 10 ms (maxima 27-92 ms) with
// huge pages against 184-303 (70-120 ms) without, and 10-55 % more
// events/s (BENCHMARKS.md, coordinator section 4). Where huge pages are off the
// hint does nothing and the slab is plain 4 KiB pages.
type slab struct {
	mem     []byte
	cleanup runtime.Cleanup
}

// mappedSize is what mapSlab maps for n bytes: n rounded up to whole huge
// pages.
func mappedSize(n int) uintptr { return (uintptr(n) + hugePage - 1) &^ (hugePage - 1) }

// mapSlab maps n bytes, zeroed, from the kernel at a hugePage boundary
// (mappedSize(n) in all) and asks for huge pages. The tail beyond n is
// never written: with 4 KiB pages it takes no memory; with huge pages the
// last one is resident whole (1 MiB past an entry page's 5 MiB, 16 bytes
// per key).
func mapSlab(n int) (*slab, error) {
	size := mappedSize(n)
	// Map a huge page more than needed and cut the unaligned head and
	// tail off, since mmap only promises 4 KiB alignment.
	raw, err := unix.MmapPtr(-1, 0, nil, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size+hugePage, err)
	}
	head := (hugePage - uintptr(raw)%hugePage) % hugePage
	if head > 0 {
		_ = unix.MunmapPtr(raw, head)
	}
	base := unsafe.Add(raw, head)
	if tail := hugePage - head; tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(base, size), tail)
	}
	mem := unsafe.Slice((*byte)(base), size)
	// Advice only: without transparent huge pages the call fails or is
	// ignored, and the slab works as 4 KiB pages.
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	sl := &slab{mem: mem[:n:n]}
	sl.cleanup = runtime.AddCleanup(sl, func(b unsafe.Pointer) { _ = unix.MunmapPtr(b, size) }, base)
	return sl, nil
}

// newTable returns a zeroed table of n slots and its slab (nil when it is
// on the Go heap: small tables, or if mmap fails).
func newTable(n int) ([]uint64, *slab) {
	if n < mapSlots {
		return make([]uint64, n), nil
	}
	sl, err := mapSlab(n * 8)
	if err != nil {
		return make([]uint64, n), nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&sl.mem[0])), n), sl
}

// newEntryPage returns a zeroed entry page and its slab (nil, with the
// page on the Go heap, if mmap fails). Entries hold no Go pointers, so
// memory the collector does not see is safe for them.
func newEntryPage() ([]entry, *slab) {
	sl, err := mapSlab(pageSize * int(unsafe.Sizeof(entry{})))
	if err != nil {
		return make([]entry, pageSize), nil
	}
	return unsafe.Slice((*entry)(unsafe.Pointer(&sl.mem[0])), pageSize), sl
}

// release hands bytes [from, to) of the slab back to the kernel; they
// read as zero afterwards.
func (sl *slab) release(from, to uint64) {
	if sl != nil {
		_ = unix.Madvise(sl.mem[from:to], unix.MADV_DONTNEED)
	}
}

// free unmaps the slab now; its memory must not be used again.
func (sl *slab) free() {
	if sl != nil {
		sl.cleanup.Stop()
		_ = unix.MunmapPtr(unsafe.Pointer(&sl.mem[0]), mappedSize(len(sl.mem)))
	}
}

// ckey is the compact, comparable identity of an object key.
type ckey struct {
	hash  [inlineMax]byte
	rank  int64
	model uint32
	salt  uint32
	group uint32
	hlen  uint8
}

type entry struct {
	k          ckey
	size       int64
	prev, next uint32
	// sent is the in-flight mark and the dispatch count in one word (the
	// entry's 80 bytes have no room for another field): the low
	// stampBits are seconds since the ledger epoch, plus one, of the last
	// dispatch of this key as an eviction victim (0 when none); the high
	// bits count its dispatches since it was last stored, up to
	// maxDispatchCount, so a key whose delete event never comes back can be
	// told from one still awaited (see PlanOptions.MaxDispatches).
	sent uint32
	// gen changes whenever the slot is freed, so a planned Victim can tell
	// that its entry was deleted (or the slot reused) before dispatch. It
	// sits in the same cache line as next and sent, which the planner reads
	// anyway.
	gen uint32
}

// list is a doubly linked list of entries through their prev and next.
type list struct{ head, tail uint32 }

var emptyList = list{head: nilIdx, tail: nilIdx}

// saltState is one salt's keys and usage. Its keys are in one of two lists,
// as the entry's parkedBit says. lru orders them from least (head) to most
// recently used. parked holds pinned keys the planner stepped over, in the
// order it met them (their LRU order), so that a later plan does not walk
// them again: with many old pinned keys, every cycle used to walk all of
// them under the ledger lock before it found a victim. An unpinned key goes
// back to the head of lru, behind nothing but keys already planned as
// victims (see relinkUnpinned); a store or lookup of a parked key moves it
// to the tail of lru, as for any key.
type saltState struct {
	name        string
	lru, parked list
	count       int
	bytes       byteSum
}

// byteSum is a sum of entry sizes, exact in 128 bits. Sizes are any int64
// >= 0 (the doors check only the sign), so an int64 sum of two absurd
// ones wrapped negative, and a salt with negative usage was skipped by
// every plan and left out of Usage: exempt from its quota. Reads saturate
// at math.MaxInt64; deletes bring the sum back exactly.
type byteSum struct {
	hi int64
	lo uint64
}

// add adds v (a size, or a negative size change) to b.
func (b *byteSum) add(v int64) {
	var carry uint64
	b.lo, carry = bits.Add64(b.lo, uint64(v), 0)
	// v>>63 is v's sign extended into the high word.
	b.hi += v>>63 + int64(carry)
}

// get is b clamped to [0, math.MaxInt64].
func (b byteSum) get() int64 {
	switch {
	case b.hi < 0:
		return 0
	case b.hi > 0 || b.lo > math.MaxInt64:
		return math.MaxInt64
	}
	return int64(b.lo)
}

// float is b as a float64, not saturated, for the watermark comparison.
func (b byteSum) float() float64 { return float64(b.hi)*(1<<64) + float64(b.lo) }

// inOrder is s's two lists, least recent first: a parked key is older than
// every key in lru but the victims planned ahead of it.
func (s *saltState) inOrder() [2]*list { return [2]*list{&s.parked, &s.lru} }

// Op is a usage event type.
type Op uint8

// Event types, as the wire's "store", "lookup" and "delete".
const (
	OpStore Op = iota + 1
	OpLookup
	OpDelete
)

// ParseOp maps a wire type name to an Op.
func ParseOp(s string) (Op, bool) {
	switch s {
	case "store":
		return OpStore, true
	case "lookup":
		return OpLookup, true
	case "delete":
		return OpDelete, true
	}
	return 0, false
}

// String is the wire name.
func (o Op) String() string {
	switch o {
	case OpStore:
		return "store"
	case OpLookup:
		return "lookup"
	case OpDelete:
		return "delete"
	}
	return "unknown"
}

// Key is a validated object key prepared for the ledger without taking its
// lock: the hash is decoded, the invariants are checked.
type Key struct {
	hash  [inlineMax]byte
	hlen  int
	long  string // the raw hash when longer than inlineMax
	Model string
	Salt  string
	Rank  int64
	Group int64
}

// MaxModelNameBytes bounds a key's model_name. Upstream has no bound; an S3
// object name, which holds the model name, is at most 1024 bytes, so no
// key with a longer one can be in L2, and without a bound one event could
// make the ledger intern (and a checkpoint carry) a name of up to the
// event body's 64 MiB.
const MaxModelNameBytes = 1024

// Prepare validates an encoded key (Python bytes.fromhex rules, the
// ObjectKey invariants and MaxModelNameBytes) into a Key.
func Prepare(e *objkey.Encoded) (Key, error) {
	var k Key
	if n := len(e.ModelName); n > MaxModelNameBytes {
		return Key{}, &objkey.InvalidError{Reason: fmt.Sprintf("model_name exceeds max length %d bytes (got %d)", MaxModelNameBytes, n)}
	}
	h := e.ChunkHashHex
	if len(h) <= 2*inlineMax && len(h)%2 == 0 {
		// A read-only byte view of h: hex.Decode never writes its source,
		// and a []byte(h) copy would be a heap allocation per event.
		src := unsafe.Slice(unsafe.StringData(h), len(h))
		if _, err := hex.Decode(k.hash[:len(h)/2], src); err == nil {
			k.hlen = len(h) / 2
		} else {
			k.hlen = -1
		}
	} else {
		k.hlen = -1
	}
	if k.hlen < 0 {
		raw, err := objkey.FromHex(h)
		if err != nil {
			return Key{}, err
		}
		if len(raw) <= inlineMax {
			k.hlen = copy(k.hash[:], raw)
		} else {
			k.long = string(raw)
		}
	}
	k.Model, k.Salt, k.Rank, k.Group = e.ModelName, e.CacheSalt, e.KVRank, e.ObjectGroupID
	if strings.IndexByte(k.Model, '@') >= 0 || k.Group < 0 {
		return Key{}, (objkey.Key{ModelName: k.Model, ObjectGroupID: k.Group}).Validate()
	}
	if err := objkey.ValidateSalt(k.Salt); err != nil {
		return Key{}, err
	}
	return k, nil
}

// FromObjectKey converts an already-validated objkey.Key.
func FromObjectKey(o objkey.Key) Key {
	k := Key{Model: o.ModelName, Salt: o.CacheSalt, Rank: o.KVRank, Group: o.ObjectGroupID}
	if len(o.ChunkHash) <= inlineMax {
		k.hlen = copy(k.hash[:], o.ChunkHash)
	} else {
		k.long = o.ChunkHash
	}
	return k
}

// ObjectKey is FromObjectKey's inverse: the key's fields with its raw hash.
func (k Key) ObjectKey() objkey.Key {
	h := k.long
	if h == "" {
		h = string(k.hash[:k.hlen])
	}
	return objkey.Key{ChunkHash: h, ModelName: k.Model, CacheSalt: k.Salt, KVRank: k.Rank, ObjectGroupID: k.Group}
}

// Event is one prepared usage event.
type Event struct {
	Op    Op
	Key   Key
	Bytes int64
}

// Ledger is the accounting state. Safe for concurrent use.
type Ledger struct {
	mu    sync.Mutex
	seed  uint64
	epoch time.Time

	// holdFor and afterYield are test hooks: a plan holds the lock for at
	// most holdFor instead of planHold (negative: the whole plan, the
	// behaviour before yielding, for benchmarks), and calls afterYield
	// without it.
	holdFor    time.Duration
	afterYield func()

	pages [][]entry
	// pageSlabs keep the mapped entry pages alive (nil for one on the Go
	// heap); pages[i] lies in pageSlabs[i].
	pageSlabs []*slab
	n         uint32 // entries ever allocated (high-water mark)
	// freeHead is the first reusable entry slot; freed entries are linked
	// through their next field (a freed entry is in no LRU list), so the
	// free list needs no slice that would be copied whole as it grows.
	freeHead uint32
	live     int
	// index is an open-addressing table; each slot is 0 (empty) or the
	// entry index + 1 in the low 32 bits and the key hash's high 32 bits in
	// the high half, so probes skip non-matching entries without touching
	// them (the entries are the cache misses).
	index []uint64
	mask  uint64
	// indexSlab, oldSlab and nextSlab back index, old and next when they
	// are mapped from the kernel (see slab).
	indexSlab, oldSlab, nextSlab *slab
	// old is the previous, half-size index while growth migrates it into
	// index (nil otherwise); every key is in exactly one of the two. The
	// slots from migStart (an empty slot) up to migStart+migDone, wrapping,
	// are migrated and empty; see findOld for why probes stay correct.
	old      []uint64
	oldMask  uint64
	migStart uint64
	migDone  uint64
	// migrated counts old slots processed since New, so tests can check the
	// work each call does.
	migrated uint64
	// next is the table the next growth will use, allocated ahead and
	// prefaulted up to nextFaulted (see prefaultStep); nil otherwise.
	next        []uint64
	nextFaulted int

	// spare is an entry page Refill allocated and faulted in ahead, nil
	// when none is ready; need wakes the refill loop (see reserve.go).
	spare     []entry
	spareSlab *slab
	need      chan struct{}
	// spareReady mirrors spare != nil for Refill's checks without the lock;
	// preparedNow counts pages handed over during the current Refill.
	spareReady  atomic.Bool
	preparedNow atomic.Int64
	// Counters of the reserve (see ReserveStats).
	preparedPages, preparedTables, coldPages, coldTables uint64
	// ingesting counts ingest requests in flight (IngestStarted); quiet
	// holds a token when it fell to zero, for Refill's yield.
	ingesting               atomic.Int32
	quiet                   chan struct{}
	yieldWaits, yieldCapped atomic.Uint64
	// liveHint and allocHint are live and n as of the last Apply or
	// Store, for Refill to tell, without the lock, how close the ingest
	// path is to needing what it prepares.
	liveHint  atomic.Int64
	allocHint atomic.Uint32

	// models, saltNames and longs intern model names, salts and the
	// names of keys that are not inline to the ids in ckey. An id is
	// freed (and later reused) once no entry and no pin refers to it, so
	// names that come and go (per-request salts, a reporter inventing
	// models) do not accumulate. salts[id] is the state of saltNames'
	// id; a freed salt's state is reset, never removed.
	models    names
	saltNames names
	salts     []*saltState
	longs     names

	total byteSum
	pins  map[ckey]int32

	// listings counts the listings in progress (BeginListing) and
	// listed the keys deleted meanwhile, which StoreListed refuses; nil
	// when none is in progress. At maxListed keys it stops growing.
	listings int
	listed   map[Key]struct{}

	// stage is Apply's reusable first-pass buffer; sink keeps its
	// cache-warming loads from being optimised away.
	stage []staged
	sink  uint64
}

// New returns an empty ledger.
func New() *Ledger {
	l := &Ledger{
		seed:      rand.Uint64() | 1,
		epoch:     time.Now(),
		models:    newNames(),
		saltNames: newNames(),
		longs:     newNames(),
		pins:      map[ckey]int32{},
		freeHead:  nilIdx,
		need:      make(chan struct{}, 1),
		quiet:     make(chan struct{}, 1),
		// Room for 4M entries before append copies the page list, so
		// growing it is rare (and an allocation small enough not to
		// matter) on the ingest path.
		pages: make([][]entry, 0, 64),
	}
	l.wake()
	l.index = make([]uint64, 1024)
	l.mask = 1023
	return l
}

func (l *Ledger) at(i uint32) *entry { return &l.pages[i>>pageBits][i&(pageSize-1)] }

func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func (l *Ledger) hashOf(k *ckey) uint64 {
	const p = 0x9E3779B97F4A7C15
	h := l.seed
	h = bits.RotateLeft64((h^binary.LittleEndian.Uint64(k.hash[0:8]))*p, 31)
	h = bits.RotateLeft64((h^binary.LittleEndian.Uint64(k.hash[8:16]))*p, 31)
	h = bits.RotateLeft64((h^binary.LittleEndian.Uint64(k.hash[16:24]))*p, 31)
	h = bits.RotateLeft64((h^binary.LittleEndian.Uint64(k.hash[24:32]))*p, 31)
	h = bits.RotateLeft64((h^uint64(k.rank))*p, 31)
	h = bits.RotateLeft64((h^(uint64(k.model)<<32|uint64(k.salt)))*p, 31)
	return mix(h ^ (uint64(k.group)<<8 | uint64(k.hlen)))
}

// homeOf is a slot's home position in a table of mask+1 slots, derived from
// its 32-bit tag alone so that growing and backward-shift deletion never
// touch the entries.
func homeOf(slot, mask uint64) uint64 {
	return ((slot >> 32) * 0x9E3779B97F4A7C15 >> 29) & mask
}

// findH looks k up given its hash h (hashOf(k)). When found, inOld tells
// which table holds it and slot is its position there; when not, slot is
// where it goes in index.
func (l *Ledger) findH(k *ckey, h uint64) (slot uint64, inOld bool, idx uint32, tag uint64, ok bool) {
	tag = h & tagMask
	slot = homeOf(tag, l.mask)
	for {
		v := l.index[slot]
		if v == 0 {
			break
		}
		if v&tagMask == tag {
			if i := uint32(v) - 1; l.at(i).k == *k {
				return slot, false, i, tag, true
			}
		}
		slot = (slot + 1) & l.mask
	}
	if l.old != nil {
		if s, i, ok := l.findOld(k, tag); ok {
			return s, true, i, tag, true
		}
	}
	return slot, false, 0, tag, false
}

// findOld probes the table being migrated. Migration empties old's slots in
// order from migStart, which was empty, so the keys left are those between
// the cursor and migStart. A key whose home is already migrated sits at or
// after the cursor (it was never moved, and linear probing only places keys
// forward of their home), with no empty slot between the cursor and it, so
// its probe starts at the cursor. Deleting from old keeps this true:
// backward shifts only move keys into the hole being filled, which is at or
// after the cursor, and the shift stops at migStart at the latest.
func (l *Ledger) findOld(k *ckey, tag uint64) (uint64, uint32, bool) {
	s := homeOf(tag, l.oldMask)
	if (s-l.migStart)&l.oldMask < l.migDone {
		s = (l.migStart + l.migDone) & l.oldMask
	}
	for {
		v := l.old[s]
		if v == 0 {
			return 0, 0, false
		}
		if v&tagMask == tag {
			if i := uint32(v) - 1; l.at(i).k == *k {
				return s, i, true
			}
		}
		s = (s + 1) & l.oldMask
	}
}

// startGrow replaces index by an empty table twice its size and keeps the
// current one as old, to be moved over migrateStep slots per store or
// delete (like Redis's incremental rehash). Doubling in one go took 147 ms
// under the lock at 6.3M keys; this costs one allocation and the scan for
// an empty slot to start from (one cluster, short at 3/4 load).
func (l *Ledger) startGrow() {
	if l.old != nil {
		// Unreachable with migrateStep >= 2 (see its comment); kept so a
		// smaller step could never lose keys.
		l.migrate(len(l.old))
	}
	l.old, l.oldMask, l.oldSlab = l.index, l.mask, l.indexSlab
	if l.next == nil {
		l.next, l.nextSlab = newTable(len(l.old) * 2)
	}
	l.index, l.indexSlab = l.next, l.nextSlab
	l.next, l.nextSlab, l.nextFaulted = nil, nil, 0
	l.mask = uint64(len(l.index) - 1)
	s := uint64(0)
	for l.old[s] != 0 {
		s++
	}
	l.migStart, l.migDone = s, 0
}

// prefault writes the first slot of every memory page among the next
// prefaultStep slots of next, so that no store after growth waits for the
// kernel to map a page.
func (l *Ledger) prefault() {
	end := min(l.nextFaulted+prefaultStep, len(l.next))
	for i := (l.nextFaulted + pageSlots - 1) &^ (pageSlots - 1); i < end; i += pageSlots {
		l.next[i] = 0
	}
	l.nextFaulted = end
}

// migrate moves up to n slots of old into index, in slot order from
// migStart, and drops old when all of it has moved. A mapped old table is
// handed back to the kernel chunk by chunk as the cursor leaves each chunk
// (nothing reads the migrated region except migStart's slot, whose chunk
// is kept), so that freeing it never costs one long munmap.
func (l *Ledger) migrate(n int) {
	for ; n > 0 && l.old != nil; n-- {
		s := (l.migStart + l.migDone) & l.oldMask
		if v := l.old[s]; v != 0 {
			l.old[s] = 0
			d := homeOf(v, l.mask)
			for l.index[d] != 0 {
				d = (d + 1) & l.mask
			}
			l.index[d] = v
		}
		l.migDone++
		l.migrated++
		if l.oldSlab != nil && (s+1)%releaseSlots == 0 && s/releaseSlots != l.migStart/releaseSlots {
			l.oldSlab.release((s+1-releaseSlots)*8, (s+1)*8)
		}
		if l.migDone == uint64(len(l.old)) {
			l.oldSlab.free()
			l.old, l.oldSlab = nil, nil
		}
	}
}

// unindex removes a slot of tab (index or old) with backward-shift
// deletion so probes stay short without tombstones.
func unindex(tab []uint64, mask, slot uint64) {
	for {
		tab[slot] = 0
		next := slot
		for {
			next = (next + 1) & mask
			v := tab[next]
			if v == 0 {
				return
			}
			home := homeOf(v, mask)
			// Move v back into the hole when its home is not in (slot, next].
			if (next > slot && (home <= slot || home > next)) || (next < slot && home <= slot && home > next) {
				tab[slot] = v
				slot = next
				break
			}
		}
	}
}

// names interns strings to ids with reference counts. An id whose count
// is zero at a sweep is freed and handed out again by a later intern, so
// the tables hold only the names something refers to. Not safe for
// concurrent use (the ledger's lock guards it).
type names struct {
	list []string
	ids  map[string]uint32
	// refs counts the entries and pins referring to each id; -1 marks a
	// free id.
	refs []int32
	free []uint32
	// idle lists the ids interned or released to zero references since
	// the last sweep: the only ones a sweep may free.
	idle []uint32
}

func newNames() names { return names{ids: map[string]uint32{}} }

// intern returns s's id, assigning one (a freed one first) when s has none.
// A new id has no reference yet: the caller takes one, or the next sweep
// frees it.
func (n *names) intern(s string) uint32 {
	id, _ := n.internNew(s)
	return id
}

// internNew is intern, also reporting whether the id was assigned now.
func (n *names) internNew(s string) (uint32, bool) {
	if id, ok := n.ids[s]; ok {
		return id, false
	}
	// Clone: s may alias a pooled request buffer.
	s = strings.Clone(s)
	var id uint32
	if k := len(n.free); k > 0 {
		id = n.free[k-1]
		n.free = n.free[:k-1]
		n.list[id], n.refs[id] = s, 0
	} else {
		id = uint32(len(n.list))
		n.list = append(n.list, s)
		n.refs = append(n.refs, 0)
	}
	n.ids[s] = id
	n.idle = append(n.idle, id)
	return id, true
}

func (n *names) ref(id uint32) { n.refs[id]++ }

func (n *names) unref(id uint32) {
	if n.refs[id]--; n.refs[id] == 0 {
		n.idle = append(n.idle, id)
	}
}

// sweep frees the idle ids nothing refers to, calling freed for each.
func (n *names) sweep(freed func(id uint32)) {
	for _, id := range n.idle {
		if n.refs[id] != 0 {
			continue // referred to again, or already freed
		}
		delete(n.ids, n.list[id])
		n.list[id], n.refs[id] = "", -1
		n.free = append(n.free, id)
		if freed != nil {
			freed(id)
		}
	}
	n.idle = n.idle[:0]
}

// live is the number of ids in use.
func (n *names) live() int { return len(n.ids) }

func (l *Ledger) saltID(s string) uint32 {
	id, fresh := l.saltNames.internNew(s)
	if fresh {
		if int(id) == len(l.salts) {
			l.salts = append(l.salts, &saltState{lru: emptyList, parked: emptyList})
		}
		l.salts[id].name = l.saltNames.list[id]
	}
	return id
}

// hold and release count one reference (an entry's or a pin's) to the
// names c uses; must hold mu.
func (l *Ledger) hold(c *ckey) {
	l.models.ref(c.model)
	l.saltNames.ref(c.salt)
	if c.hlen == longHash {
		l.longs.ref(binary.LittleEndian.Uint32(c.hash[:4]))
	}
}

func (l *Ledger) release(c *ckey) {
	l.models.unref(c.model)
	l.saltNames.unref(c.salt)
	if c.hlen == longHash {
		l.longs.unref(binary.LittleEndian.Uint32(c.hash[:4]))
	}
}

// sweepNames frees the names no entry or pin refers to any more. It runs
// at the end of each operation, never inside one: Apply computes every
// event's ids before applying the first, and those must stay valid to the
// end of the batch. Must hold mu.
func (l *Ledger) sweepNames() {
	l.models.sweep(nil)
	l.saltNames.sweep(func(id uint32) { *l.salts[id] = saltState{lru: emptyList, parked: emptyList} })
	l.longs.sweep(nil)
}

// compact interns the key's strings; must hold mu.
func (l *Ledger) compact(k *Key) ckey {
	c := ckey{rank: k.Rank, model: l.models.intern(k.Model), salt: l.saltID(k.Salt)}
	if k.inline() {
		c.hash, c.hlen, c.group = k.hash, uint8(k.hlen), uint32(k.Group)
		return c
	}
	// Rare: a hash longer than 32 bytes or a huge group id; intern both.
	c.setLong(l.longs.intern(k.longName()))
	return c
}

// lookupKey finds a key without interning new strings; must hold mu.
func (l *Ledger) lookupKey(k *Key) (ckey, bool) {
	m, ok := l.models.ids[k.Model]
	if !ok {
		return ckey{}, false
	}
	s, ok := l.saltNames.ids[k.Salt]
	if !ok {
		return ckey{}, false
	}
	c := ckey{rank: k.Rank, model: m, salt: s}
	if k.inline() {
		c.hash, c.hlen, c.group = k.hash, uint8(k.hlen), uint32(k.Group)
		return c, true
	}
	id, ok := l.longs.ids[k.longName()]
	if !ok {
		return ckey{}, false
	}
	c.setLong(id)
	return c, true
}

// inline reports whether the hash and group fit in a ckey.
func (k *Key) inline() bool { return k.long == "" && k.Group <= math.MaxUint32 }

// longName is the longs-table name of a key that is not inline: the
// group's 8 little-endian bytes, then the raw hash (expand splits it).
func (k *Key) longName() string {
	raw := k.long
	if raw == "" {
		raw = string(k.hash[:k.hlen])
	}
	var g [8]byte
	binary.LittleEndian.PutUint64(g[:], uint64(k.Group))
	return string(g[:]) + raw
}

// setLong marks c as not inline, naming entry id of the longs table.
func (c *ckey) setLong(id uint32) {
	binary.LittleEndian.PutUint32(c.hash[:4], id)
	c.hlen = longHash
}

func (l *Ledger) alloc() uint32 {
	if i := l.freeHead; i != nilIdx {
		l.freeHead = l.at(i).next
		return i
	}
	i := l.n
	if i>>pageBits >= uint32(len(l.pages)) {
		p, sl := l.newPage()
		l.pages, l.pageSlabs = append(l.pages, p), append(l.pageSlabs, sl)
	}
	l.n++
	return i
}

// listOf is the list of s that e is in.
func (s *saltState) listOf(e *entry) *list {
	if e.sent&parkedBit != 0 {
		return &s.parked
	}
	return &s.lru
}

// unlink takes e out of whichever of s's lists holds it.
func (l *Ledger) unlink(s *saltState, i uint32, e *entry) {
	ls := s.listOf(e)
	if e.prev != nilIdx {
		l.at(e.prev).next = e.next
	} else {
		ls.head = e.next
	}
	if e.next != nilIdx {
		l.at(e.next).prev = e.prev
	} else {
		ls.tail = e.prev
	}
	e.prev, e.next = nilIdx, nilIdx
}

// pushTail appends e, unlinked, to ls; the caller sets e's parkedBit to
// match.
func (l *Ledger) pushTail(ls *list, i uint32, e *entry) {
	e.prev, e.next = ls.tail, nilIdx
	if ls.tail != nilIdx {
		l.at(ls.tail).next = i
	} else {
		ls.head = i
	}
	ls.tail = i
}

// pushHead prepends e, unlinked, to ls.
func (l *Ledger) pushHead(ls *list, i uint32, e *entry) {
	e.prev, e.next = nilIdx, ls.head
	if ls.head != nilIdx {
		l.at(ls.head).prev = i
	} else {
		ls.tail = i
	}
	ls.head = i
}

// toMRU moves e to the most recent end of s's lru, out of parked if it was
// there.
func (l *Ledger) toMRU(s *saltState, i uint32, e *entry) {
	if e.sent&parkedBit == 0 && s.lru.tail == i {
		return
	}
	l.unlink(s, i, e)
	e.sent &^= parkedBit
	l.pushTail(&s.lru, i, e)
}

// store records a key's size and moves it to the MRU end (a re-store
// replaces the size, it never double-counts); must hold mu.
func (l *Ledger) store(k *Key, size int64) {
	c := l.compact(k)
	l.storeH(&c, l.hashOf(&c), size)
}

func (l *Ledger) storeH(cp *ckey, h uint64, size int64) {
	c := *cp
	l.migrate(migrateStep)
	if l.next != nil {
		l.prefault()
	}
	slot, _, i, tag, ok := l.findH(&c, h)
	s := l.salts[c.salt]
	if ok {
		e := l.at(i)
		delta := size - e.size
		e.size = size
		// A store is news that L2 holds the key now, so earlier dispatches
		// without a delete event are no evidence that it is gone; the
		// in-flight stamp stays.
		e.sent &= stampMask | parkedBit
		s.bytes.add(delta)
		l.total.add(delta)
		l.toMRU(s, i, e)
		return
	}
	i = l.alloc()
	e := l.at(i)
	*e = entry{k: c, size: size, gen: e.gen}
	l.index[slot] = tag | uint64(i+1)
	l.pushTail(&s.lru, i, e)
	l.hold(&c)
	s.count++
	s.bytes.add(size)
	l.total.add(size)
	l.live++
	switch n, size := uint64(l.live), uint64(len(l.index)); {
	case n*4 > size*3:
		l.startGrow()
	case n*8 > size*5 && l.next == nil && l.old == nil:
		// Refill has not prepared it (see wantTable): allocate it here,
		// prefaulted by the stores to come.
		l.next, l.nextSlab = newTable(int(size * 2))
		l.coldTables++
	case n == size/2+1 && l.next == nil && l.old == nil:
		l.wake()
	}
}

func (l *Ledger) touchH(c *ckey, h uint64) {
	if _, _, i, _, ok := l.findH(c, h); ok {
		l.toMRU(l.salts[c.salt], i, l.at(i))
	}
}

func (l *Ledger) removeH(c *ckey, h uint64) bool {
	l.migrate(migrateStep)
	slot, inOld, i, _, ok := l.findH(c, h)
	if !ok {
		return false
	}
	e := l.at(i)
	s := l.salts[c.salt]
	l.unlink(s, i, e)
	s.count--
	s.bytes.add(-e.size)
	l.total.add(-e.size)
	if inOld {
		unindex(l.old, l.oldMask, slot)
	} else {
		unindex(l.index, l.mask, slot)
	}
	l.release(&e.k)
	*e = entry{gen: e.gen + 1, next: l.freeHead}
	l.freeHead = i
	l.live--
	return true
}

// Counts tallies applied events by type. DeleteMissed counts the deletes
// (included in Delete) of keys the ledger did not hold.
type Counts struct{ Store, Lookup, Delete, DeleteMissed int }

// staged is one event's compact key and hash, computed in Apply's first pass.
type staged struct {
	c  ckey
	h  uint64
	ok bool
}

// Apply applies a prepared batch in order under one lock acquisition.
//
// It runs in two passes. The first interns and hashes every key (in event
// order, so a store interns names a later lookup in the batch needs) and
// reads each key's home index slot and candidate entry: those loads do not
// depend on each other, so the CPU overlaps their cache misses. The second
// pass applies the events, now mostly hitting cache.
func (l *Ledger) Apply(events []Event) Counts {
	var c Counts
	l.mu.Lock()
	defer l.mu.Unlock()
	if cap(l.stage) < len(events) {
		l.stage = make([]staged, len(events))
	}
	st := l.stage[:len(events)]
	var sink uint64
	for i := range events {
		ev := &events[i]
		if ev.Op == OpStore {
			st[i].c, st[i].ok = l.compact(&ev.Key), true
		} else {
			st[i].c, st[i].ok = l.lookupKey(&ev.Key)
		}
		if st[i].ok {
			h := l.hashOf(&st[i].c)
			st[i].h = h
			if v := l.index[homeOf(h&tagMask, l.mask)]; v != 0 {
				sink += uint64(l.at(uint32(v) - 1).size)
			}
		}
	}
	l.sink += sink
	for i := range events {
		ev := &events[i]
		switch ev.Op {
		case OpStore:
			l.storeH(&st[i].c, st[i].h, ev.Bytes)
			c.Store++
		case OpLookup:
			if st[i].ok {
				l.touchH(&st[i].c, st[i].h)
			}
			c.Lookup++
		case OpDelete:
			if !st[i].ok || !l.removeH(&st[i].c, st[i].h) {
				c.DeleteMissed++
			}
			if l.listed != nil {
				l.noteListedDelete(ev.Key)
			}
			c.Delete++
		}
	}
	l.sweepNames()
	l.hint()
	return c
}

// hint publishes live and n for Refill (see liveHint); must hold mu.
func (l *Ledger) hint() {
	l.liveHint.Store(int64(l.live))
	l.allocHint.Store(l.n)
}

// Store records one stored key (resync).
func (l *Ledger) Store(k Key, size int64) {
	l.mu.Lock()
	l.store(&k, size)
	l.sweepNames()
	l.hint()
	l.mu.Unlock()
}

// maxListed bounds the deletes a listing remembers (about 100 bytes each).
const maxListed = 1 << 20

// BeginListing starts a listing of L2 (the startup resync) whose entries
// will be recorded with StoreListed; EndListing ends it. A page of the
// listing describes L2 as it was when the server read it: a key deleted
// after that, whose delete event is applied before the page, would
// otherwise be stored again by the page and stay in the ledger for good (no
// delete event for it comes again), counted in its salt's usage.
func (l *Ledger) BeginListing() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.listings++; l.listed == nil {
		l.listed = map[Key]struct{}{}
	}
}

// EndListing ends a listing BeginListing started, forgetting the deletes
// recorded when it was the last one.
func (l *Ledger) EndListing() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.listings--; l.listings <= 0 {
		l.listings, l.listed = 0, nil
	}
}

// noteListedDelete records a delete during a listing; must hold mu.
func (l *Ledger) noteListedDelete(k Key) {
	if len(l.listed) >= maxListed {
		return
	}
	// The decoded strings may alias a pooled request body.
	k.Model, k.Salt, k.long = strings.Clone(k.Model), strings.Clone(k.Salt), strings.Clone(k.long)
	l.listed[k] = struct{}{}
}

// StoreListed records one key a listing returned, like Store, unless a
// delete of it was applied since BeginListing (superseded: a key deleted
// and stored again meanwhile is in the ledger already, from its store
// event). With keepKnown, for a listing merged into a ledger restored from
// a checkpoint, a key the ledger holds already keeps its size and its LRU
// position (the checkpoint's order is the fleet's, a listing's is only the
// adapter's), and only a key it lacks (stored after the checkpoint was
// written, its event lost with the process) is added, at the MRU end.
// stored reports whether the key was recorded.
func (l *Ledger) StoreListed(k Key, size int64, keepKnown bool) (stored, superseded bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, gone := l.listed[k]; gone {
		return false, true
	}
	if keepKnown {
		if c, ok := l.lookupKey(&k); ok {
			if _, _, _, _, held := l.findH(&c, l.hashOf(&c)); held {
				return false, false
			}
		}
	}
	l.store(&k, size)
	l.sweepNames()
	l.hint()
	return true, false
}

// SaltUsage is one salt's tracked bytes (math.MaxInt64 when they sum to
// more, see byteSum).
func (l *Ledger) SaltUsage(salt string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if id, ok := l.saltNames.ids[salt]; ok {
		return l.salts[id].bytes.get()
	}
	return 0
}

// Usage returns every salt with positive usage, and the total, each
// saturated at math.MaxInt64.
func (l *Ledger) Usage() (map[string]int64, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]int64{}
	for _, s := range l.salts {
		if b := s.bytes.get(); b > 0 {
			m[s.name] = b
		}
	}
	return m, l.total.get()
}

// Stats is a summary for metrics.
type Stats struct {
	Keys       int
	Bytes      int64
	PinnedKeys int
}

// Stats returns counts.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Keys: l.live, Bytes: l.total.get(), PinnedKeys: len(l.pins)}
}

// Pin adds delta (+1 pin, -1 unpin) to each key's reference count. An unpin
// never goes below zero and an unknown key is ignored.
func (l *Ledger) Pin(keys []objkey.Key, delta int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.sweepNames()
	var unpinned []ckey
	for _, o := range keys {
		k := FromObjectKey(o)
		if delta > 0 {
			c := l.compact(&k)
			n, ok := l.pins[c]
			if !ok {
				l.hold(&c)
			}
			l.pins[c] = n + delta
			continue
		}
		c, ok := l.lookupKey(&k)
		if !ok {
			continue
		}
		if n, ok := l.pins[c]; ok {
			if n+delta <= 0 {
				delete(l.pins, c)
				unpinned = append(unpinned, c)
				l.release(&c)
			} else {
				l.pins[c] = n + delta
			}
		}
	}
	// Released names are swept only by the deferred sweepNames, so the
	// ids in unpinned still name what they named.
	for i := len(unpinned) - 1; i >= 0; i-- {
		l.unpark(&unpinned[i])
	}
}

// unpark moves c's entry, if it is parked, back to the head of its salt's
// lru, where the planner will find it first: it was parked because it was
// at least as old as the keys then at the head, and every key behind it is
// newer. Pin calls it in reverse request order, so the keys of one unpin
// take the request's order, which is their chunk order and, as a prompt's
// chunks are stored first to last, their LRU order. Must hold mu.
func (l *Ledger) unpark(c *ckey) {
	_, _, i, _, ok := l.findH(c, l.hashOf(c))
	if !ok {
		return
	}
	if e := l.at(i); e.sent&parkedBit != 0 {
		l.unparkAt(l.salts[c.salt], i, e)
	}
}

// unparkAt moves parked entry e from s.parked to the head of s.lru; must
// hold mu.
func (l *Ledger) unparkAt(s *saltState, i uint32, e *entry) {
	l.unlink(s, i, e)
	e.sent &^= parkedBit
	l.pushHead(&s.lru, i, e)
}

// unparkAll moves every salt's parked keys back to the head of its lru, in
// their order; must hold mu.
func (l *Ledger) unparkAll() {
	for _, s := range l.salts {
		for i := s.parked.tail; i != nilIdx; i = s.parked.tail {
			l.unparkAt(s, i, l.at(i))
		}
	}
}

// PinCount is one pinned key with its count.
type PinCount struct {
	Key   objkey.Key
	Count int32
}

// Pins lists every pinned key (for the state file).
func (l *Ledger) Pins() []PinCount {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]PinCount, 0, len(l.pins))
	for c, n := range l.pins {
		out = append(out, PinCount{Key: l.expand(&c), Count: n})
	}
	return out
}

// RestorePins sets pin counts (state file load).
func (l *Ledger) RestorePins(pins []PinCount) {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.sweepNames()
	for _, p := range pins {
		if p.Count <= 0 {
			continue
		}
		k := FromObjectKey(p.Key)
		c := l.compact(&k)
		if _, ok := l.pins[c]; !ok {
			l.hold(&c)
		}
		l.pins[c] = p.Count
	}
}

// keyNames are the interned names a ckey refers to, copied under the lock
// so a key can be expanded after it (the ids may be reused meanwhile).
type keyNames struct{ model, salt, long string }

// namesOf copies c's names; must hold mu.
func (l *Ledger) namesOf(c *ckey) keyNames {
	n := keyNames{model: l.models.list[c.model], salt: l.salts[c.salt].name}
	if c.hlen == longHash {
		n.long = l.longs.list[binary.LittleEndian.Uint32(c.hash[:4])]
	}
	return n
}

// expand is c as an object key; must hold mu.
func (l *Ledger) expand(c *ckey) objkey.Key { return expandNames(c, l.namesOf(c)) }

// expandNames builds the object key of c from its names (no lock needed).
func expandNames(c *ckey, n keyNames) objkey.Key {
	k := objkey.Key{ModelName: n.model, CacheSalt: n.salt, KVRank: c.rank, ObjectGroupID: int64(c.group)}
	if c.hlen == longHash {
		raw := n.long
		k.ObjectGroupID = int64(binary.LittleEndian.Uint64([]byte(raw[:8])))
		k.ChunkHash = raw[8:]
	} else {
		k.ChunkHash = string(c.hash[:c.hlen])
	}
	return k
}

// PlanOptions are the eviction knobs.
type PlanOptions struct {
	Ratio     float64
	Watermark float64
	// InflightTTL withholds keys dispatched less than this long ago; 0
	// disables the in-flight set (upstream behaviour: re-send every cycle).
	InflightTTL time.Duration
	// Now is the planning time; zero means time.Now().
	Now time.Time
	// Mark records the chosen victims as in flight.
	Mark bool
	// MaxDispatches, when positive, drops from the ledger, instead of
	// choosing it, a key that was already dispatched this many times
	// without being deleted or stored since: its delete event never came
	// back, so the key is most likely gone from L2 (its delete event lost
	// or applied before the store it followed) and sending it again would
	// go on forever while its bytes hold its salt over the watermark.
	// Dispatches are counted whether or not Mark is set; Unmark takes back
	// a failed one. Capped at 15.
	MaxDispatches int
}

// Victim references one planned entry: its slot and the slot's generation.
// Plans hold references, not keys, so planning touches one cache line per
// victim; Materialize turns them into keys at dispatch time.
type Victim struct {
	idx, gen uint32
}

// Plan is the result of one planning pass: victims per salt in LRU order.
type Plan struct {
	Salts   []string
	Victims [][]Victim
	// InFlight counts keys that would have been chosen but were withheld
	// because an earlier dispatch is still awaiting their delete events.
	InFlight int
	// Dropped counts the keys removed from the ledger as phantoms (see
	// PlanOptions.MaxDispatches) and DroppedBytes their sizes.
	Dropped      int
	DroppedBytes int64
	// Walked counts the entries the plan visited, pinned keys it parked
	// included: the plan's cost under the ledger lock.
	Walked int
}

// Len is the number of victims.
func (p *Plan) Len() int {
	n := 0
	for _, v := range p.Victims {
		n += len(v)
	}
	return n
}

// Materialize resolves victims to object keys, dropping any whose entry was
// deleted since planning, and any pinned since (a pin the plan could not
// see: it came while the plan let ingest in, or before this chunk), whose
// dispatch it takes back as Unmark does; live is the surviving victims,
// parallel to keys.
// It holds the lock only to copy this slice's compact keys and their
// names, so a large plan is expanded in dispatch-sized chunks while ingest
// goes on; the keys are built after unlocking (from the copied names: a
// name's id may be freed and reused as soon as the lock is released).
func (l *Ledger) Materialize(vs []Victim) (keys []objkey.Key, live []Victim) {
	cks := make([]ckey, 0, len(vs))
	ns := make([]keyNames, 0, len(vs))
	live = make([]Victim, 0, len(vs))
	l.mu.Lock()
	checkPins := len(l.pins) > 0
	for _, v := range vs {
		if v.idx < l.n {
			if e := l.at(v.idx); e.gen == v.gen {
				if checkPins && l.pins[e.k] > 0 {
					e.unmark()
					continue
				}
				cks = append(cks, e.k)
				ns = append(ns, l.namesOf(&e.k))
				live = append(live, v)
			}
		}
	}
	l.mu.Unlock()
	keys = make([]objkey.Key, len(cks))
	for i := range cks {
		keys[i] = expandNames(&cks[i], ns[i])
	}
	return keys, live
}

// stampBits of entry.sent hold the dispatch time: 2^28 seconds is 8.5
// years, after which stamps wrap (a wrapped key is at worst withheld or
// re-sent once early).
// The three bits above them count dispatches, and the top bit is
// parkedBit.
const (
	stampBits        = 28
	stampMask        = 1<<stampBits - 1
	parkedBit        = 1 << 31
	maxDispatchCount = 1<<(31-stampBits) - 1
)

func (l *Ledger) stamp(now time.Time) uint32 {
	d := now.Sub(l.epoch)
	if d < 0 {
		d = 0
	}
	return uint32(d/time.Second)%stampMask + 1
}

// dispatches is how many times e was dispatched since it was last stored.
func (e *entry) dispatches() int { return int(e.sent &^ parkedBit >> stampBits) }

// ComputePlan selects victims: for each salt whose usage reaches
// watermark × limit, ratio of its tracked keys by count (all of them when
// the limit is 0), oldest first, never a pinned key. Keys still in flight
// count toward the target but are not chosen again.
//
// The walk gives the ledger lock up every planHold (see planYield), so
// that ingest never waits for a whole plan: 36 ms for the 2,000,000
// victims of BenchmarkEvictionPlan, far more for a first walk over a
// million pinned keys. A salt a plan is walking cannot be swept meanwhile
// (the plan holds a reference to its name), and a lane whose next entry
// was deleted meanwhile ends its salt's share there, short of its target:
// the next cycle plans the rest. A key the walk took and that a store or
// lookup moved meanwhile to its salt's MRU end is not taken again there.
func (l *Ledger) ComputePlan(limits quota.Limits, o PlanOptions) *Plan {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	held := time.Now()
	stamp := l.stamp(now)
	ttl := uint32(math.Ceil(o.InflightTTL.Seconds()))
	maxSent := min(o.MaxDispatches, maxDispatchCount)
	count := o.MaxDispatches > 0
	p := &Plan{}
	// Pass 1 picks the salts and their targets so pass 2 can write every
	// victim into one exactly-sized array (at millions of victims, growing
	// per-salt slices costs more than the walk).
	type job struct {
		s      *saltState
		id     uint32
		target int
	}
	var jobs []job
	total := 0
	for id, s := range l.salts {
		if s.bytes.get() <= 0 || s.count == 0 {
			continue
		}
		limit, ok := limits.Effective(s.name)
		if !ok {
			continue
		}
		if s.bytes.float() < o.Watermark*float64(limit) {
			continue
		}
		ratio := o.Ratio
		if limit == 0 {
			ratio = 1
		}
		target := int(math.Floor(float64(s.count) * ratio))
		if ratio > 0 && target == 0 {
			target = 1
		}
		if target == 0 {
			continue
		}
		jobs = append(jobs, job{s, uint32(id), target})
		total += target
	}
	for _, jb := range jobs {
		l.saltNames.ref(jb.id)
	}
	// Pass 2 walks the salts' LRU lists. Each list node is usually a cache
	// (and TLB) miss, so up to `lanes` lists are walked in lock step: their
	// loads are independent and the CPU overlaps the misses. Job j writes
	// into its own region all[off[j] : off[j]+target[j]].
	all := make([]Victim, total)
	checkPins := len(l.pins) > 0
	type cursor struct {
		job, off, n, taken int
		at, gen            uint32
	}
	const lanes = 16
	var lane [lanes]cursor
	active := 0
	nextJob, nextOff := 0, 0
	counts := make([]int, len(jobs))
	offs := make([]int, len(jobs))
	// taken is the entries this plan took (chose, or withheld as in
	// flight), from its first yield on: a taken key looked up or stored
	// while the lock was given up moves to its salt's MRU end, where the
	// walk can meet it again, and was then planned twice (sent twice, its
	// dispatch count raised twice). Before the first yield nothing moves,
	// so the set is only built then, from all and withheld. A plan that
	// marks with a TTL (the coordinator's default) keeps none: its victims
	// read as in flight when met again, so they are never chosen twice
	// (only counted in InFlight), and the set's bit per entry costs a
	// yielding plan 15-40 % more time (BenchmarkEvictionPlan, 10M keys).
	dedup := !o.Mark || ttl == 0
	var taken idxSet
	var withheld []uint32
	refill := func(c *cursor) bool {
		for nextJob < len(jobs) {
			j := nextJob
			nextJob++
			offs[j] = nextOff
			*c = cursor{job: j, off: nextOff, at: jobs[j].s.lru.head}
			nextOff += jobs[j].target
			if c.at != nilIdx {
				return true
			}
		}
		return false
	}
	for i := range lane {
		if refill(&lane[i]) {
			active++
		} else {
			lane[i].job = -1
		}
	}
	for visits := 0; active > 0; {
		if visits++; visits%planCheckEvery == 0 && l.planYield(held) {
			for li := range lane {
				if c := &lane[li]; c.job >= 0 {
					c.gen = l.at(c.at).gen
					counts[c.job] = c.n
				}
			}
			if dedup && taken == nil {
				taken.grow(l.n)
				for j := range nextJob {
					for _, v := range all[offs[j] : offs[j]+counts[j]] {
						taken.add(v.idx)
					}
				}
				for _, i := range withheld {
					taken.add(i)
				}
				withheld = nil
			}
			l.mu.Unlock()
			if l.afterYield != nil {
				l.afterYield()
			}
			// A waiter woken by Unlock would usually lose the lock to
			// the Lock right behind it (sync.Mutex hands it over only to
			// a waiter that waited 1 ms); giving up the processor lets it
			// run first.
			runtime.Gosched()
			l.mu.Lock()
			held = time.Now()
			checkPins = len(l.pins) > 0
			// Cover the entries stored meanwhile. A taken slot freed and
			// reused meanwhile still reads as taken: a key stored during
			// the plan, the most recent, which the next cycle plans.
			if dedup {
				taken.grow(l.n)
			}
			for li := range lane {
				c := &lane[li]
				if c.job >= 0 && l.at(c.at).gen != c.gen {
					counts[c.job] = c.n
					if !refill(c) {
						c.job = -1
						active--
					}
				}
			}
			continue
		}
		for li := range lane {
			c := &lane[li]
			if c.job < 0 {
				continue
			}
			e := l.at(c.at)
			next := e.next
			p.Walked++
			if checkPins && l.pins[e.k] > 0 {
				// Parked, it is not walked again until a store, a
				// lookup or its unpin puts it back in lru.
				s := jobs[c.job].s
				l.unlink(s, c.at, e)
				e.sent |= parkedBit
				l.pushTail(&s.parked, c.at, e)
			} else if taken.has(c.at) {
				// Met again at the MRU end (see taken); counted already.
			} else {
				c.taken++
				sent := e.sent & stampMask
				switch {
				case ttl > 0 && sent != 0 && (stamp-sent)&stampMask < ttl:
					p.InFlight++
					if taken != nil {
						taken.add(c.at)
					} else if dedup {
						withheld = append(withheld, c.at)
					}
				case count && e.dispatches() >= maxSent:
					p.Dropped++
					p.DroppedBytes += e.size
					// removeH unlinks e and frees its slot; next was read
					// above, and the names it releases are swept after
					// the walk, once no job needs its salt's state.
					l.removeH(&e.k, l.hashOf(&e.k))
				default:
					all[c.off+c.n] = Victim{idx: c.at, gen: e.gen}
					c.n++
					taken.add(c.at)
					n := uint32(e.dispatches())
					if count && n < maxDispatchCount {
						n++
					}
					if o.Mark {
						sent = stamp
					}
					e.sent = n<<stampBits | sent
				}
			}
			c.at = next
			if c.at == nilIdx || c.taken >= jobs[c.job].target {
				counts[c.job] = c.n
				if !refill(c) {
					c.job = -1
					active--
				}
			}
		}
	}
	for j, jb := range jobs {
		if n := counts[j]; n > 0 {
			p.Salts = append(p.Salts, jb.s.name)
			p.Victims = append(p.Victims, all[offs[j]:offs[j]+n:offs[j]+n])
		}
	}
	for _, jb := range jobs {
		l.saltNames.unref(jb.id)
	}
	l.sweepNames()
	if p.Dropped > 0 {
		l.hint()
	}
	return p
}

// idxSet is a set of entry indices, one bit each.
type idxSet []uint64

// grow makes s cover the indices below n (and non-nil).
func (s *idxSet) grow(n uint32) {
	if w := int(n/64) + 1; w > len(*s) {
		*s = append(*s, make([]uint64, w-len(*s))...)
	}
}

// add puts i in s; a nil set stays empty.
func (s idxSet) add(i uint32) {
	if w := int(i / 64); w < len(s) {
		s[w] |= 1 << (i % 64)
	}
}

func (s idxSet) has(i uint32) bool {
	w := int(i / 64)
	return w < len(s) && s[w]&(1<<(i%64)) != 0
}

// planHold is how long a plan holds the ledger lock before it lets ingest
// in (section 4 of BENCHMARKS.md: no ingest request is to wait 10 ms); the
// clock is read every planCheckEvery lane steps (16 entries each).
const (
	planHold       = time.Millisecond
	planCheckEvery = 64
)

// planYield says whether a plan that took the lock at held gives it up
// now.
func (l *Ledger) planYield(held time.Time) bool {
	hold := planHold
	if l.holdFor != 0 {
		hold = l.holdFor
	}
	return hold >= 0 && time.Since(held) >= hold
}

// Unmark clears the in-flight mark of victims whose dispatch failed, so the
// next cycle sends them again, and takes that dispatch back from their
// counts: a server that could not be reached or whose adapter failed says
// nothing about whether the keys are still in L2.
func (l *Ledger) Unmark(vs []Victim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range vs {
		if v.idx < l.n {
			if e := l.at(v.idx); e.gen == v.gen {
				e.unmark()
			}
		}
	}
}

// unmark clears e's in-flight mark and takes one dispatch back from its
// count; must hold mu.
func (e *entry) unmark() {
	n := uint32(e.dispatches())
	if n > 0 {
		n--
	}
	e.sent = n<<stampBits | e.sent&parkedBit
}

// Flat returns every victim in plan order (salts in plan order, each in LRU
// order).
func (p *Plan) Flat() []Victim {
	out := make([]Victim, 0, p.Len())
	for _, vs := range p.Victims {
		out = append(out, vs...)
	}
	return out
}
