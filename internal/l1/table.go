package l1

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Errors returned by Table.
var (
	ErrNotFound    = errors.New("key not found")
	ErrNotReadable = errors.New("object is not read-locked")
)

// MaxReaders bounds the read locks one call may take per object, as
// upstream clamps num_kv_readers.
const MaxReaders = 128

// Slot is a byte range of the pool.
type Slot struct {
	Offset int64
	Size   int64
}

type state uint8

const (
	staging  state = iota // reserved by one writer tag, invisible to readers
	resident              // committed and visible
	detached              // removed from the table, memory still referenced
	freed                 // memory returned to the allocator
)

// object is one buffer in the pool. Every field is guarded by Table.mu.
//
// Reference counting: the memory of an object is returned to the allocator
// only when nothing can touch it any more, i.e. it is not in the table (or
// is evicted), has no live read lease (readers == 0 or the lease expired)
// and no pins (write-behind uploads in progress). Removing a referenced
// object (force delete, clear) detaches it instead; the last release, unpin
// or the sweep after lease expiry frees it. So no byte a reader or an
// uploader may still read is ever handed to a writer.
type object struct {
	key      objkey.Key
	off      int64
	size     int64 // logical bytes; physical is Allocator.RoundUp(size)
	readExp  int64 // unix nanos when the read lease ends
	writeExp int64 // unix nanos when the write lease ends (staging only)
	readers  int32
	pins     int32
	// holders records which named owners (request ids) hold how many of
	// the readers, so an owner can never release more than it took and
	// nobody can release another owner's locks. Anonymous locks are
	// readers minus the holders' sum. Cleared when the lease expires.
	holders []holder
	inline  [1]holder              // backing store for the common single holder
	elem    eviction.Elem[*object] // link in the eviction order
	state   state
	temp    bool
}

type stageKey struct {
	tag string
	key objkey.Key
}

type holder struct {
	owner string
	n     int32
}

func (o *object) holder(owner string) int {
	for i := range o.holders {
		if o.holders[i].owner == owner {
			return i
		}
	}
	return -1
}

func (o *object) held() int32 {
	var n int32
	for _, h := range o.holders {
		n += h.n
	}
	return n
}

// Handle refers to an object for a caller that pinned it (write-behind).
type Handle struct{ o *object }

// Key is the object's key.
func (h Handle) Key() objkey.Key { return h.o.key }

// Slot is the object's pool range (valid while pinned).
func (h Handle) Slot() Slot { return Slot{h.o.off, h.o.size} }

// TableConfig configures NewTable.
type TableConfig struct {
	Size     int64 // bytes managed
	Align    int64
	ReadTTL  time.Duration
	WriteTTL time.Duration
	Policy   string // eviction policy name: LRU, IsolatedLRU, noop ("" = noop)
}

// Table is the L1 object table. One mutex guards everything: every
// operation is atomic over its key list, as upstream's L1 manager, and the
// per-key work is a few map operations, so the critical sections are short.
// The eviction order (order.go) is guarded by the same mutex.
type Table struct {
	mu       sync.Mutex
	alloc    *Allocator
	order    *order
	readTTL  int64
	writeTTL int64

	resident map[objkey.Key]*object
	staging  map[stageKey]*object
	cleared  map[stageKey]*object // staging objects removed by Clear, still owned by their writer
	detached map[*object]struct{}
	temps    map[*object]struct{} // resident temporary objects
	// heldDetached indexes detached objects that named owners still hold,
	// so their releases find them after the key was deleted or cleared.
	heldDetached map[objkey.Key][]*object

	saltBytes    map[string]int64 // resident physical bytes per salt
	stagingBytes int64
	// readHeld holds the resident objects with readers > 0 (some leases
	// may have run out unnoticed) and pinned counts resident objects with
	// pins, so Stats need not scan every object under mu.
	readHeld map[*object]struct{}
	pinned   int

	expiredReads  int64
	expiredWrites int64
}

// NewTable builds a table over [0, cfg.Size).
func NewTable(cfg TableConfig) (*Table, error) {
	ord, err := newOrder(cfg.Policy)
	if err != nil {
		return nil, err
	}
	return &Table{
		alloc:        NewAllocator(cfg.Size, cfg.Align),
		order:        ord,
		readTTL:      int64(cfg.ReadTTL),
		writeTTL:     int64(cfg.WriteTTL),
		resident:     map[objkey.Key]*object{},
		staging:      map[stageKey]*object{},
		cleared:      map[stageKey]*object{},
		detached:     map[*object]struct{}{},
		temps:        map[*object]struct{}{},
		heldDetached: map[objkey.Key][]*object{},
		saltBytes:    map[string]int64{},
		readHeld:     map[*object]struct{}{},
	}, nil
}

func now() int64 { return time.Now().UnixNano() }

// expiry is when a lease of ttl taken at now ends, saturating at the
// largest time: the flags accept TTLs up to the largest time.Duration, and
// now + ttl past 2^63 ns would wrap negative, a lease over before it
// began.
func expiry(now, ttl int64) int64 {
	if ttl > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + ttl
}

// liveReaders returns the object's reader count, first expiring a lease
// that ran out (a crashed reader never wedges an object).
func (t *Table) liveReaders(o *object, now int64) int32 {
	if o.readers > 0 && now > o.readExp {
		o.readers = 0
		o.holders = nil
		t.expiredReads++
		delete(t.readHeld, o)
	}
	return o.readers
}

func (t *Table) evictable(o *object, now int64) bool {
	return o.state == resident && o.pins == 0 && t.liveReaders(o, now) == 0
}

func (t *Table) free(o *object) {
	if o.state == freed {
		return
	}
	t.alloc.Free(o.off, o.size)
	if o.state == detached {
		t.unindexDetached(o)
	}
	delete(t.detached, o)
	delete(t.temps, o)
	o.state = freed
}

// removeResident takes o out of the table and frees or detaches it.
func (t *Table) removeResident(o *object, now int64) {
	delete(t.resident, o.key)
	delete(t.temps, o)
	delete(t.readHeld, o)
	if o.pins > 0 {
		t.pinned--
	}
	t.order.remove(o)
	t.saltBytes[o.key.CacheSalt] -= t.alloc.RoundUp(o.size)
	if t.saltBytes[o.key.CacheSalt] <= 0 {
		delete(t.saltBytes, o.key.CacheSalt)
	}
	if o.pins == 0 && t.liveReaders(o, now) == 0 {
		t.free(o)
		return
	}
	o.state = detached
	t.detached[o] = struct{}{}
	if len(o.holders) > 0 {
		t.heldDetached[o.key] = append(t.heldDetached[o.key], o)
	}
}

func (t *Table) unindexDetached(o *object) {
	list := t.heldDetached[o.key]
	for i, d := range list {
		if d == o {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(t.heldDetached, o.key)
	} else {
		t.heldDetached[o.key] = list
	}
}

// Reserve gives writer tag a private staging slot for every key that is
// not resident, all or nothing. slots[i] is zero for a key that is resident,
// repeated in keys, or already staged by tag under a live write lease. A
// staging object of tag whose lease expired (or that Clear removed) is
// handed to the new writer when its size matches, as upstream does.
func (t *Table) Reserve(tag string, keys []objkey.Key, sizes []int64) ([]Slot, error) {
	return t.reserve(tag, keys, sizes, t.writeTTL)
}

// ReserveHeld is Reserve for a writer that always commits or aborts what
// it staged, however long filling the buffers takes (the engine's own L2
// loads): its buffers have no write lease. Under the clients' write lease
// a load slower than the lease had its buffer reclaimed by Sweep and
// handed to another writer while the load was still writing into it.
func (t *Table) ReserveHeld(tag string, keys []objkey.Key, sizes []int64) ([]Slot, error) {
	return t.reserve(tag, keys, sizes, math.MaxInt64)
}

// reserve is Reserve with write leases of ttl.
func (t *Table) reserve(tag string, keys []objkey.Key, sizes []int64, ttl int64) ([]Slot, error) {
	if len(sizes) != len(keys) {
		return nil, fmt.Errorf("%d keys but %d sizes", len(keys), len(sizes))
	}
	for i, s := range sizes {
		if s <= 0 {
			return nil, fmt.Errorf("size of key %d must be positive (got %d)", i, s)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	slots := make([]Slot, len(keys))
	p := t.plan(tag, keys, sizes, now)
	reuse, reuseObj, fresh, freshSz, replaced := p.reuse, p.reuseObj, p.fresh, p.freshSz, p.replaced
	offs, ok := t.alloc.AllocBatch(freshSz)
	if !ok {
		return nil, ErrOutOfMemory
	}
	for j, i := range reuse {
		o := reuseObj[j]
		sk := stageKey{tag, keys[i]}
		if t.cleared[sk] == o {
			delete(t.cleared, sk)
			t.stagingBytes += t.alloc.RoundUp(o.size)
			t.staging[sk] = o
		} else {
			t.expiredWrites++
		}
		t.stagingBytes += t.alloc.RoundUp(sizes[i]) - t.alloc.RoundUp(o.size)
		o.size, o.writeExp, o.state = sizes[i], expiry(now, ttl), staging
		slots[i] = Slot{o.off, o.size}
	}
	for _, o := range replaced {
		sk := stageKey{tag, o.key}
		if t.staging[sk] == o {
			delete(t.staging, sk)
			t.stagingBytes -= t.alloc.RoundUp(o.size)
			t.expiredWrites++
		} else {
			delete(t.cleared, sk)
		}
		t.free(o)
	}
	for j, i := range fresh {
		o := &object{key: keys[i], off: offs[j], size: sizes[i], writeExp: expiry(now, ttl), state: staging}
		t.staging[stageKey{tag, keys[i]}] = o
		t.stagingBytes += t.alloc.RoundUp(o.size)
		slots[i] = Slot{o.off, o.size}
	}
	return slots, nil
}

// reservePlan is what a Reserve of a batch would do with each key.
type reservePlan struct {
	reuse    []int // indices taking over an old buffer
	reuseObj []*object
	fresh    []int // indices needing a new buffer
	freshSz  []int64
	replaced []*object // old buffers to free once the batch succeeded
}

// plan sorts tag's batch into the keys that need no slot (resident,
// repeated, or staged by tag under a live lease), those taking over tag's
// expired or cleared buffer of the same physical size, and those needing a
// new buffer. Reserve follows it; MakeRoom sizes its evictions by it, so
// that keys needing no new buffer cost no other object its place.
func (t *Table) plan(tag string, keys []objkey.Key, sizes []int64, now int64) reservePlan {
	var p reservePlan
	seen := make(map[objkey.Key]struct{}, len(keys))
	for i, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if _, ok := t.resident[k]; ok {
			continue
		}
		sk := stageKey{tag, k}
		old, ok := t.staging[sk]
		if ok && now <= old.writeExp {
			continue
		}
		if !ok {
			old, ok = t.cleared[sk]
		}
		if ok {
			if t.alloc.RoundUp(old.size) == t.alloc.RoundUp(sizes[i]) {
				p.reuse, p.reuseObj = append(p.reuse, i), append(p.reuseObj, old)
				continue
			}
			p.replaced = append(p.replaced, old)
		}
		p.fresh, p.freshSz = append(p.fresh, i), append(p.freshSz, sizes[i])
	}
	return p
}

// CommitOpts says how committed objects enter the table.
type CommitOpts struct {
	// Temporary objects are freed when their last reader leaves.
	Temporary bool
	// Readers > 0 read-locks each committed key that many times (for
	// Owner), atomically with the commit.
	Readers int
	Owner   string
	// Pins holds new objects against eviction until Unpin is called this
	// many times (one per pending write-behind upload).
	Pins int
}

// CommitResult reports a Commit.
type CommitResult struct {
	// Published are the objects that became resident, pinned per opts.
	Published []Handle
	// Committed counts keys now resident because of this call, including
	// keys that became resident through another writer meanwhile (their
	// staged copy is dropped).
	Committed int
	// Locked lists keys read-locked for opts.Owner (opts.Readers > 0).
	Locked []objkey.Key
	// Missing: tag staged nothing for the key (never, aborted, cleared or
	// reclaimed). Expired: the write lease ran out; the copy is dropped.
	Missing, Expired int
}

// Commit admits tag's staged objects for keys. Committed keys are handed
// to the eviction policy as one batch (reverse insertion: tail chunks are
// evicted first).
func (t *Table) Commit(tag string, keys []objkey.Key, opts CommitOpts) CommitResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	var res CommitResult
	var added []*object
	for _, k := range keys {
		sk := stageKey{tag, k}
		o, ok := t.staging[sk]
		if !ok {
			if c, ok := t.cleared[sk]; ok {
				delete(t.cleared, sk)
				t.free(c)
			}
			res.Missing++
			continue
		}
		delete(t.staging, sk)
		t.stagingBytes -= t.alloc.RoundUp(o.size)
		if now > o.writeExp {
			t.free(o)
			t.expiredWrites++
			res.Expired++
			continue
		}
		if r, ok := t.resident[k]; ok {
			t.free(o)
			res.Committed++
			if opts.Readers > 0 {
				t.lock(r, opts.Owner, opts.Readers, now)
				res.Locked = append(res.Locked, k)
			}
			continue
		}
		o.state, o.temp, o.pins = resident, opts.Temporary, int32(opts.Pins)
		if o.pins > 0 {
			t.pinned++
		}
		t.resident[k] = o
		t.saltBytes[k.CacheSalt] += t.alloc.RoundUp(o.size)
		if o.temp {
			t.temps[o] = struct{}{}
		}
		if opts.Readers > 0 {
			t.lock(o, opts.Owner, opts.Readers, now)
			res.Locked = append(res.Locked, k)
		}
		res.Committed++
		res.Published = append(res.Published, Handle{o})
		added = append(added, o)
	}
	t.order.add(added)
	return res
}

// Abort drops tag's staged objects for keys.
func (t *Table) Abort(tag string, keys []objkey.Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		sk := stageKey{tag, k}
		if o, ok := t.staging[sk]; ok {
			delete(t.staging, sk)
			t.stagingBytes -= t.alloc.RoundUp(o.size)
			t.free(o)
		}
		if o, ok := t.cleared[sk]; ok {
			delete(t.cleared, sk)
			t.free(o)
		}
	}
}

func clampReaders(n int) int32 {
	if n < 1 {
		return 1
	}
	if n > MaxReaders {
		return MaxReaders
	}
	return int32(n)
}

// lock takes n read locks on o for owner ("" = anonymous) and renews the
// lease. The count saturates at MaxInt32: every lock renews the lease, so
// repeated lookups could otherwise add up past it and wrap negative (no
// release would then free the object before its lease ran out). Locks not
// counted are not held by anyone, so the holders still sum to at most
// readers.
func (t *Table) lock(o *object, owner string, n int, now int64) {
	t.liveReaders(o, now)
	c := min(clampReaders(n), math.MaxInt32-o.readers)
	o.readers += c
	o.readExp = expiry(now, t.readTTL)
	if o.state == resident {
		t.readHeld[o] = struct{}{}
	}
	if owner == "" || c == 0 {
		return
	}
	if i := o.holder(owner); i >= 0 {
		o.holders[i].n += c
		return
	}
	if o.holders == nil {
		o.holders = o.inline[:0]
	}
	o.holders = append(o.holders, holder{owner, c})
}

// ReadLock takes n read locks (clamped to [1, MaxReaders]) on every
// resident key for owner and returns the slots of the locked keys (the zero
// Slot for a miss). Staging objects are invisible. A lock renews the
// object's read lease.
func (t *Table) ReadLock(owner string, keys []objkey.Key, n int) []Slot {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	out := make([]Slot, len(keys))
	for i, k := range keys {
		if o, ok := t.resident[k]; ok {
			t.lock(o, owner, n, now)
			out[i] = Slot{o.off, o.size}
		}
	}
	return out
}

// ReadLockChunks is ReadLock over keys given per chunk: hit (one entry per
// key, chunk-major) is set for each key locked; it returns the hit count.
// It saves callers a flattened copy of the keys.
func (t *Table) ReadLockChunks(owner string, chunks [][]objkey.Key, n int, hit []bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	i, hits := 0, 0
	for _, ks := range chunks {
		for _, k := range ks {
			if o, ok := t.resident[k]; ok {
				t.lock(o, owner, n, now)
				hit[i] = true
				hits++
			}
			i++
		}
	}
	return hits
}

// ContainsChunks sets hit for every resident key (no lock taken) and
// returns the hit count.
func (t *Table) ContainsChunks(chunks [][]objkey.Key, hit []bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, hits := 0, 0
	for _, ks := range chunks {
		for _, k := range ks {
			if _, hit[i] = t.resident[k]; hit[i] {
				hits++
			}
			i++
		}
	}
	return hits
}

// Release drops up to n read locks per key. With an owner, only locks that
// owner took and still holds are released: first on the resident object,
// then on detached ones (deleted or cleared while held), until n are
// released; a lease that expired took the owner's locks with it. Owner ""
// releases anonymous locks only. Temporary objects whose last reader left
// are deleted; their keys are returned.
func (t *Table) Release(owner string, keys []objkey.Key, n int) (released int, deleted []objkey.Key) {
	// Counts are int32 in the table: a larger n (a client's reader count)
	// would wrap, negative at 2^31, and release nothing or corrupt a
	// holder's count. No holder has more than MaxInt32 locks, so
	// clamping releases exactly what the larger n would.
	n32 := int32(min(max(n, 1), math.MaxInt32))
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	for _, k := range keys {
		o := t.resident[k]
		if owner == "" {
			if o == nil {
				continue
			}
			m := min(n32, t.liveReaders(o, now)-o.held())
			released += int(m)
			if t.unlock(o, m, now) {
				deleted = append(deleted, o.key)
			}
			continue
		}
		left := n32
		if o != nil {
			m := t.releaseHeld(o, owner, left, now)
			left -= m
			released += int(m)
			if t.unlock(o, m, now) {
				deleted = append(deleted, o.key)
			}
		}
		// The owner may hold locks on the resident object and on copies
		// of the key deleted or cleared meanwhile (it locked the key again
		// after a Clear). Stopping at the first copy left the others'
		// locks, and their memory, held until the lease ran out although n
		// covered them. Freeing a copy edits the index, so walk a copy.
		if held := t.heldDetached[k]; left > 0 && len(held) > 0 {
			for _, d := range slices.Clone(held) {
				m := t.releaseHeld(d, owner, left, now)
				left -= m
				released += int(m)
				t.unlock(d, m, now)
				if left == 0 {
					break
				}
			}
		}
	}
	return released, deleted
}

// releaseHeld takes up to n of owner's read locks off o's holders (first
// expiring a lease that ran out) and returns how many; unlock must then
// drop them from the reader count.
func (t *Table) releaseHeld(o *object, owner string, n int32, now int64) int32 {
	t.liveReaders(o, now)
	hi := o.holder(owner)
	if hi < 0 {
		return 0
	}
	m := min(n, o.holders[hi].n)
	if o.holders[hi].n -= m; o.holders[hi].n == 0 {
		o.holders = append(o.holders[:hi], o.holders[hi+1:]...)
		if len(o.holders) == 0 {
			o.holders = nil
		}
	}
	return m
}

// unlock drops m read locks from o and frees it when that was the last
// reference; it reports whether a resident (temporary) key left the table.
func (t *Table) unlock(o *object, m int32, now int64) bool {
	if m <= 0 {
		return false
	}
	o.readers -= m
	if o.readers != 0 {
		return false
	}
	delete(t.readHeld, o)
	return t.maybeFree(o, now)
}

// maybeFree frees an unreferenced detached object or temporary resident
// one; it reports whether a resident key left the table.
func (t *Table) maybeFree(o *object, now int64) bool {
	if o.pins > 0 || t.liveReaders(o, now) > 0 {
		return false
	}
	switch {
	case o.state == detached:
		t.free(o)
	case o.state == resident && o.temp:
		t.removeResident(o, now)
		return true
	}
	return false
}

// Slots returns the slots of keys, all of which must be resident and
// read-locked; otherwise nothing is returned.
func (t *Table) Slots(keys []objkey.Key) ([]Slot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	out := make([]Slot, len(keys))
	for i, k := range keys {
		o, ok := t.resident[k]
		if !ok {
			return nil, fmt.Errorf("key %d: %w", i, ErrNotFound)
		}
		if t.liveReaders(o, now) == 0 {
			return nil, fmt.Errorf("key %d: %w", i, ErrNotReadable)
		}
		out[i] = Slot{o.off, o.size}
	}
	return out, nil
}

// Contains reports which keys are resident (no lock taken).
func (t *Table) Contains(keys []objkey.Key) []bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i] = t.resident[k]
	}
	return out
}

// Touch is the recency signal for eviction.
func (t *Table) Touch(keys []objkey.Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	objs := make([]*object, 0, len(keys))
	for _, k := range keys {
		if o, ok := t.resident[k]; ok {
			objs = append(objs, o)
		}
	}
	t.order.touch(objs)
}

// Unpin drops one pin of h; when the object is no longer referenced and
// already removed, its memory is freed.
func (t *Table) Unpin(h Handle) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o := h.o
	if o.pins > 0 {
		if o.pins--; o.pins == 0 && o.state == resident {
			t.pinned--
		}
	}
	if o.pins == 0 && o.state == detached {
		t.maybeFree(o, now())
	}
}

// DropIfIdle removes h's object if it is still resident and evictable
// (the skip_l1 store policy, after every upload landed).
func (t *Table) DropIfIdle(h Handle) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	o := h.o
	if t.resident[o.key] != o || !t.evictable(o, now) {
		return false
	}
	t.removeResident(o, now)
	return true
}

// Delete removes resident keys. Read-locked or pinned objects are skipped
// unless force, in which case they are detached (their memory lives until
// the last reference ends). Missing keys are neither deleted nor skipped.
func (t *Table) Delete(keys []objkey.Key, force bool) (deleted []objkey.Key, skipped int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	for _, k := range keys {
		o, ok := t.resident[k]
		if !ok {
			continue
		}
		if !force && !t.evictable(o, now) {
			skipped++
			continue
		}
		t.removeResident(o, now)
		deleted = append(deleted, k)
	}
	return deleted, skipped
}

// Clear removes every object, locked and staging ones included. Memory
// still referenced (readers, pins, writers) is reclaimed when the reference
// ends; a writer's commit after a clear reports its key as missing.
func (t *Table) Clear() (keys []objkey.Key, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	for k, o := range t.resident {
		bytes += t.alloc.RoundUp(o.size)
		keys = append(keys, k)
		t.removeResident(o, now)
	}
	for sk, o := range t.staging {
		delete(t.staging, sk)
		t.stagingBytes -= t.alloc.RoundUp(o.size)
		t.cleared[sk] = o
	}
	return keys, bytes
}

// Cut asks Evict for Ratio of the tracked objects of one salt's list
// (IsolatedLRU) or, with Global, of every list.
type Cut struct {
	Salt   string
	Global bool
	Ratio  float64
}

// Evict applies the cuts in order. Each list gives up
// eviction.Target(len, ratio) objects, least recent first; objects that are
// read-locked or pinned are skipped and do not count. It returns the keys
// deleted and their physical bytes.
func (t *Table) Evict(cuts []Cut) (evicted []objkey.Key, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	eligible := func(o *object) bool { return t.evictable(o, now) }
	for _, c := range cuts {
		for _, l := range t.order.lists(c) {
			for _, o := range l.Oldest(c.Ratio, eligible) {
				bytes += t.alloc.RoundUp(o.size)
				evicted = append(evicted, o.key)
				t.removeResident(o, now)
			}
		}
	}
	return evicted, bytes
}

// MakeRoom evicts just enough least-recent eligible objects (resident,
// not read-locked, not pinned) that a Reserve by tag of keys with sizes
// finds the bytes it needs free, or nothing at all when every eligible object
// together would not be enough. Keys already resident, repeated or staged by tag need no room. Under
// IsolatedLRU the salts give up objects in turn, oldest first. With the
// noop policy nothing is tracked, so nothing is evicted. It returns the
// keys evicted and their physical bytes. The batch's own resident keys are
// never evicted.
//
// The eviction tick only runs at the watermark; without this a batch
// larger than the free space below the watermark would be refused for
// good. Fragmentation is not considered: KV objects of a model share one
// size, so freed bytes are usable bytes.
func (t *Table) MakeRoom(tag string, keys []objkey.Key, sizes []int64) (evicted []objkey.Key, bytes int64) {
	if len(sizes) != len(keys) {
		return nil, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	// Only the buffers Reserve would allocate need room: a key repeated in
	// the batch, one tag stages under a live lease, or one taking over
	// tag's old buffer allocates nothing (counting them evicted other
	// objects for nothing, or refused a batch that fits).
	var need int64
	for _, sz := range t.plan(tag, keys, sizes, now).freshSz {
		need += t.alloc.RoundUp(sz)
	}
	short := need - (t.alloc.Total() - t.alloc.Used())
	if short <= 0 {
		return nil, 0
	}
	keep := map[*object]bool{} // the batch's resident keys need no room, so they must stay
	for _, k := range keys {
		if o, ok := t.resident[k]; ok {
			keep[o] = true
		}
	}
	lists := t.order.lists(Cut{Global: true})
	cursors := make([]*eviction.Elem[*object], len(lists))
	for i, l := range lists {
		cursors[i] = l.Front()
	}
	var victims []*object
	for progress := true; bytes < short && progress; {
		progress = false
		for i := range cursors {
			e := cursors[i]
			for e != nil && (keep[e.Value] || !t.evictable(e.Value, now)) {
				e = e.Next()
			}
			if e == nil {
				cursors[i] = nil
				continue
			}
			victims = append(victims, e.Value)
			bytes += t.alloc.RoundUp(e.Value.size)
			cursors[i], progress = e.Next(), true
			if bytes >= short {
				break
			}
		}
	}
	if bytes < short {
		return nil, 0
	}
	for _, o := range victims {
		evicted = append(evicted, o.key)
		t.removeResident(o, now)
	}
	return evicted, bytes
}

// Sweep reclaims what expired leases left behind: staging objects whose
// writer vanished, detached objects whose readers vanished, temporary
// objects whose readers vanished. The eviction
// loop calls it every tick. It returns temporary keys deleted.
func (t *Table) Sweep() (deleted []objkey.Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	for sk, o := range t.staging {
		if now > o.writeExp {
			delete(t.staging, sk)
			t.stagingBytes -= t.alloc.RoundUp(o.size)
			t.free(o)
			t.expiredWrites++
		}
	}
	for sk, o := range t.cleared {
		if now > o.writeExp {
			// A reservation Clear removed and whose writer never came
			// back is an abandoned write like any other: count it.
			delete(t.cleared, sk)
			t.free(o)
			t.expiredWrites++
		}
	}
	for o := range t.detached {
		t.maybeFree(o, now)
	}
	for o := range t.temps {
		if t.maybeFree(o, now) {
			deleted = append(deleted, o.key)
		}
	}
	return deleted
}

// Stats is a snapshot of the table.
type Stats struct {
	UsedBytes, TotalBytes         int64
	Objects, StagingObjects       int
	StagingBytes                  int64
	ReadLocked, Temporary, Pinned int
	Detached                      int
	ExpiredReads, ExpiredWrites   int64
}

// Stats is a snapshot for status and metrics. It visits only the
// read-locked objects (to leave out leases that ran out), never the whole
// table, so a scrape does not stall the data path.
func (t *Table) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	s := Stats{
		UsedBytes: t.alloc.Used(), TotalBytes: t.alloc.Total(),
		Objects: len(t.resident), StagingObjects: len(t.staging), StagingBytes: t.stagingBytes,
		Temporary: len(t.temps), Detached: len(t.detached), Pinned: t.pinned,
		ExpiredReads: t.expiredReads, ExpiredWrites: t.expiredWrites,
	}
	for o := range t.readHeld {
		if now <= o.readExp {
			s.ReadLocked++
		}
	}
	return s
}

// Usage returns (used, total) bytes of the pool.
func (t *Table) Usage() (used, total int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.alloc.Used(), t.alloc.Total()
}

// UsageBySalt returns resident bytes per cache_salt.
func (t *Table) UsageBySalt() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int64, len(t.saltBytes))
	for s, b := range t.saltBytes {
		out[s] = b
	}
	return out
}

// Leaks lists every reference still held: live read leases (with their
// named holders), pins (write-behind uploads not settled) and staged
// writes, one line per object naming its key, sorted. An engine whose
// background work has stopped and whose clients released everything has
// none; tests check that at Close, as pebble's cache checks its reference
// counts. It walks every object under mu, so it is for tests and
// diagnostics, not for the data path.
func (t *Table) Leaks() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	var out []string
	check := func(o *object, where string) {
		if n := t.liveReaders(o, now); n > 0 {
			out = append(out, fmt.Sprintf("read lease (%s) %s: %d readers, holders %v", where, o.key, n, o.holders))
		}
		if o.pins > 0 {
			out = append(out, fmt.Sprintf("pin (%s) %s: %d pending uploads", where, o.key, o.pins))
		}
	}
	for _, o := range t.resident {
		check(o, "resident")
	}
	for o := range t.detached {
		check(o, "detached")
	}
	for sk := range t.staging {
		out = append(out, fmt.Sprintf("staged write %s by %q", sk.key, sk.tag))
	}
	for sk := range t.cleared {
		out = append(out, fmt.Sprintf("staged write (cleared) %s by %q", sk.key, sk.tag))
	}
	sort.Strings(out)
	return out
}
