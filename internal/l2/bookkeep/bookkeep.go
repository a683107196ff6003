// Package bookkeep holds the state every L2 adapter keeps beside its data:
// adapter-side lock refcounts, keys being deleted, the sizes of objects this
// process knows about (for usage accounting), and listener fan-out. It is
// upstream's base-class accounting, shared so each adapter only moves bytes.
package bookkeep

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Book is safe for concurrent use. One mutex guards locks, sizes and usage;
// it is never held across I/O. Listeners have their own lock so that a
// listener registering while events fire does not block the data path.
type Book struct {
	mu       sync.Mutex
	locks    map[objkey.Key]int      // LookupAndLock refcounts
	deleting map[objkey.Key]struct{} // keys between BeginDelete and EndDelete
	storing  map[objkey.Key]int      // keys between BeginStore and EndStore (refcounts)
	// deleted is closed (and cleared) by the next EndDelete; BeginStore
	// waits on it for keys being deleted.
	deleted  chan struct{}
	sizes    map[objkey.Key]int64 // objects counted in usage
	used     int64
	bySalt   map[string]int64
	capacity int64

	lmu       sync.RWMutex
	listeners []l2.Listener
}

// New returns a Book with the given capacity (<= 0: unbounded).
func New(capacity int64) *Book {
	return &Book{
		locks:    map[objkey.Key]int{},
		deleting: map[objkey.Key]struct{}{},
		storing:  map[objkey.Key]int{},
		sizes:    map[objkey.Key]int64{},
		bySalt:   map[string]int64{},
		capacity: capacity,
	}
}

// SetCapacity changes the capacity (DAX resize, add, remove).
func (b *Book) SetCapacity(c int64) {
	b.mu.Lock()
	b.capacity = c
	b.mu.Unlock()
}

// LockHits takes one lock reference on keys[i] for every hits[i], clears
// the hits of keys being deleted, and fires OnAccessed for the keys locked:
// the tail of every adapter's LookupAndLock.
func (b *Book) LockHits(keys []objkey.Key, hits []bool) {
	var accessed []objkey.Key
	b.mu.Lock()
	for i, k := range keys {
		if !hits[i] {
			continue
		}
		if _, gone := b.deleting[k]; gone {
			hits[i] = false
			continue
		}
		b.locks[k]++
		accessed = append(accessed, k)
	}
	b.mu.Unlock()
	b.FireAccessed(accessed)
}

// Unlock drops one lock reference per key; extra unlocks are ignored.
func (b *Book) Unlock(keys []objkey.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	release(b.locks, keys)
}

// release drops one reference per key from refs, deleting a key's entry
// with its last reference; keys without one are ignored.
func release(refs map[objkey.Key]int, keys []objkey.Key) {
	for _, k := range keys {
		if n := refs[k]; n > 1 {
			refs[k] = n - 1
		} else {
			delete(refs, k)
		}
	}
}

// LockCount is the number of lock references on k.
func (b *Book) LockCount(k objkey.Key) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.locks[k]
}

// Locked returns the keys that hold at least one lock reference (a
// snapshot; loads in flight, so usually few).
func (b *Book) Locked() []objkey.Key {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]objkey.Key, 0, len(b.locks))
	for k := range b.locks {
		out = append(out, k)
	}
	return out
}

// LockedKeys is the number of distinct locked keys.
func (b *Book) LockedKeys() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.locks)
}

// BeginStore marks keys as being stored, first waiting (or failing with
// ctx's error) until none of them is being deleted. The caller writes them
// to storage, counts those that landed with Stored, and then calls
// EndStore. A store and a delete of one key therefore never overlap: a
// delete between a write and its Stored removed an object that was then
// counted (usage over the disk), and a write between a delete's removal
// and its EndDelete put an object in place that EndDelete then forgot.
func (b *Book) BeginStore(ctx context.Context, keys []objkey.Key) error {
	for {
		b.mu.Lock()
		busy := slices.ContainsFunc(keys, func(k objkey.Key) bool {
			_, gone := b.deleting[k]
			return gone
		})
		if !busy {
			for _, k := range keys {
				b.storing[k]++
			}
			b.mu.Unlock()
			return nil
		}
		if b.deleted == nil {
			b.deleted = make(chan struct{})
		}
		wait := b.deleted
		b.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("wait for a delete of the same keys: %w", ctx.Err())
		}
	}
}

// EndStore ends a BeginStore of keys. Callers count the objects that
// landed (Stored) and fire OnStored for them before it, while the marks
// still hold off a delete of the same keys: fired after, a delete could
// remove the objects and report it first, leaving listeners tracking
// objects that are gone.
func (b *Book) EndStore(keys []objkey.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	release(b.storing, keys)
}

// BeginDelete picks the keys of keys that are not locked (nor being stored,
// nor already being deleted, nor duplicated) and marks them as being
// deleted. The caller removes them from storage and then calls EndDelete.
func (b *Book) BeginDelete(keys []objkey.Key) []objkey.Key {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]objkey.Key, 0, len(keys))
	for _, k := range keys {
		if b.locks[k] > 0 || b.storing[k] > 0 {
			continue
		}
		if _, dup := b.deleting[k]; dup {
			continue
		}
		b.deleting[k] = struct{}{}
		out = append(out, k)
	}
	return out
}

// EndDelete forgets the sizes of the victims actually removed, fires
// OnDeleted for them, then clears the deleting marks of all victims and
// wakes the stores waiting for them. Listeners hear of the removal while
// the marks still hold off a store of the same keys, so that store's
// OnStored comes after this OnDeleted, as the objects were: reported the
// other way round, listeners (the eviction policy, the coordinator's
// reporter) forgot an object that was on disk and counted. Callers do not
// fire OnDeleted for removed themselves.
func (b *Book) EndDelete(victims, removed []objkey.Key) {
	b.Forget(removed)
	b.FireDeleted(removed)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range victims {
		delete(b.deleting, k)
	}
	if b.deleted != nil {
		close(b.deleted)
		b.deleted = nil
	}
}

// Stored counts keys[i] with sizes[i]; keys already known are not counted
// twice (objects are content-addressed). A known key stored with another
// size counts its new size instead: the write replaced the object (an fs
// file recovered short, say, rewritten in full), and keeping the old size
// would leave usage off by the difference until the key is deleted.
func (b *Book) Stored(keys []objkey.Key, sizes []int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, k := range keys {
		old, known := b.sizes[k]
		if known && old == sizes[i] {
			continue
		}
		b.sizes[k] = sizes[i]
		b.used = max(0, b.used+sizes[i]-old)
		if n := b.bySalt[k.CacheSalt] + sizes[i] - old; n > 0 {
			b.bySalt[k.CacheSalt] = n
		} else {
			delete(b.bySalt, k.CacheSalt)
		}
	}
}

// Forget removes keys from usage, clamping at zero and dropping empty salt
// buckets, as upstream.
func (b *Book) Forget(keys []objkey.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forgetLocked(keys)
}

func (b *Book) forgetLocked(keys []objkey.Key) {
	for _, k := range keys {
		sz, known := b.sizes[k]
		if !known {
			continue
		}
		delete(b.sizes, k)
		b.used = max(0, b.used-sz)
		if left := b.bySalt[k.CacheSalt] - sz; left > 0 {
			b.bySalt[k.CacheSalt] = left
		} else {
			delete(b.bySalt, k.CacheSalt)
		}
	}
}

// Size returns the remembered size of k.
func (b *Book) Size(k objkey.Key) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sizes[k]
	return s, ok
}

// Known returns how many keys are counted in usage.
func (b *Book) Known() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sizes)
}

// Usage is the current accounting.
func (b *Book) Usage() l2.Usage {
	b.mu.Lock()
	defer b.mu.Unlock()
	by := make(map[string]int64, len(b.bySalt))
	for s, n := range b.bySalt {
		by[s] = n
	}
	return l2.Usage{TotalBytesUsed: b.used, TotalCapacityBytes: b.capacity, BytesByCacheSalt: by}
}

// AddListener registers l.
func (b *Book) AddListener(l l2.Listener) {
	b.lmu.Lock()
	b.listeners = append(b.listeners, l)
	b.lmu.Unlock()
}

func (b *Book) snapshot() []l2.Listener {
	b.lmu.RLock()
	defer b.lmu.RUnlock()
	return b.listeners
}

// FireStored notifies listeners of stored keys.
func (b *Book) FireStored(keys []objkey.Key, sizes []int64) {
	if len(keys) == 0 {
		return
	}
	for _, l := range b.snapshot() {
		l.OnStored(keys, sizes)
	}
}

// FireAccessed notifies listeners of lookup hits.
func (b *Book) FireAccessed(keys []objkey.Key) {
	if len(keys) == 0 {
		return
	}
	for _, l := range b.snapshot() {
		l.OnAccessed(keys)
	}
}

// FireDeleted notifies listeners of removed keys.
func (b *Book) FireDeleted(keys []objkey.Key) {
	if len(keys) == 0 {
		return
	}
	for _, l := range b.snapshot() {
		l.OnDeleted(keys)
	}
}

// Gate admits calls until Close and lets Close wait for those in flight.
// Waiting is on channels, never on a held lock (mu guards only short
// critical sections), so a Close waiting for a call is durably blocked in
// a testing/synctest bubble, and Enter and Closed never wait for a Close in
// progress: a call arriving then is refused at once.
type Gate struct {
	mu      sync.Mutex
	closed  bool          // Close has begun: Enter refuses
	n       int           // calls in flight
	drained chan struct{} // made by a Close waiting for calls; closed by the last Leave
	done    chan struct{} // closed once Close's fn has returned
}

// Enter admits one call, which must then Leave; once Close has begun it
// returns an error wrapping l2.ErrUnavailable, prefixed with the adapter's
// name.
func (g *Gate) Enter(name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("%s: %w: closed", name, l2.ErrUnavailable)
	}
	g.n++
	return nil
}

// Leave ends a call admitted by Enter.
func (g *Gate) Leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		// A Leave without its Enter would let Close run under a live call.
		panic("bookkeep: Gate.Leave without Enter")
	}
	g.n--
	if g.n == 0 && g.drained != nil {
		close(g.drained)
		g.drained = nil
	}
}

// Closed reports whether Close has begun.
func (g *Gate) Closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Close waits for the calls in flight, then runs fn once with no call in
// flight and none admitted after. Later Closes wait for that fn to return,
// then return nil, so every Close returns only once the adapter is closed.
func (g *Gate) Close(fn func() error) error {
	g.mu.Lock()
	if g.closed {
		done := g.done
		g.mu.Unlock()
		<-done
		return nil
	}
	g.closed = true
	g.done = make(chan struct{})
	defer close(g.done)
	var drained chan struct{}
	if g.n > 0 {
		g.drained = make(chan struct{})
		drained = g.drained
	}
	g.mu.Unlock()
	if drained != nil {
		<-drained
	}
	return fn()
}
