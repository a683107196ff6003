// Package dax is the "dax" L2 adapter: device-DAX nodes or plain files,
// mmap'd and cut into fixed-size slots, with an in-memory index from key to
// slot (no persistent names, no restart recovery, as upstream). Devices can
// be added, removed (drain, migrate, evict) and resized at run time for the
// /reconfigure API.
//
// Concurrency: mu guards the index, device states, free lists and counts;
// it is held only for bookkeeping, never during a copy. Copies hold the
// device's mapMu for reading (see device). An index entry carries a
// sequence number: a load copies without mu and then checks the entry is
// unchanged, so a slot that was freed and reused meanwhile is never
// reported as loaded. Reconfiguration operations are serialized by reconfMu.
package dax

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/bookkeep"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// loc is where a key lives.
type loc struct {
	dev  *device
	slot int
	gen  uint64 // device mapping generation when written
	size int64  // object bytes (<= slot_bytes)
	seq  uint64 // changes whenever the entry is rewritten
}

// Adapter is the dax adapter.
type Adapter struct {
	slotBytes int64
	hotplug   bool
	book      *bookkeep.Book

	reconfMu sync.Mutex

	mu      sync.Mutex
	index   map[objkey.Key]loc
	devices []*device
	seq     uint64
	closed  bool

	// A store's commit and its report (usage count and OnStored) exclude
	// a reconfiguration's removal of keys and its report (Forget and
	// OnDeleted), so each side reports what it saw in the index: a remove
	// or resize that dropped a key between a store's commit and its report
	// had it counted after it was forgotten and reported stored after
	// deleted. reporting counts the stores in that section and sweeping
	// is set while a reconfiguration removes keys (at most one: reconfMu);
	// both wait on settle, a channel (closed and cleared on every change),
	// never on a held lock. Guarded by mu.
	reporting int
	sweeping  bool
	settle    chan struct{}

	// afterCopy (nil outside tests) runs in Store between the copies and
	// their commit, so tests can change a device in between.
	afterCopy func()
	// afterCommit (nil outside tests) runs in Store between the commit
	// and its report.
	afterCommit func()
	// beforeMove (nil outside tests) runs in Resize between its checks
	// and the moves off the cut-off range.
	beforeMove func()
}

var _ l2.Adapter = (*Adapter)(nil)

// New maps every configured device.
func New(cfg Config) (*Adapter, error) {
	if cfg.SlotBytes <= 0 {
		return nil, fmt.Errorf("dax: slot_bytes must be positive")
	}
	a := &Adapter{slotBytes: cfg.SlotBytes, hotplug: cfg.HotplugEnabled, book: bookkeep.New(0), index: map[objkey.Key]loc{}}
	for _, dc := range cfg.Devices {
		if _, err := a.addDevice(dc.Path, dc.SizeBytes); err != nil {
			_ = a.Close()
			return nil, fmt.Errorf("dax: %w", err)
		}
	}
	return a, nil
}

// addDevice maps a new device and appends it. Caller holds reconfMu or is
// New.
func (a *Adapter) addDevice(path string, size int64) (*device, error) {
	if size < a.slotBytes {
		return nil, fmt.Errorf("device %s: %d bytes cannot hold one slot of %d bytes", path, size, a.slotBytes)
	}
	if err := a.checkSlots(path, size); err != nil {
		return nil, err
	}
	// One file or node under two paths (a symlink, a hard link, "d/./f")
	// would be mapped twice, each mapping handing out the same slots to
	// different keys: a load would return another key's bytes as loaded.
	// Add refuses this itself; this covers the configured devices of New.
	if id, _, err := identity(path); err == nil {
		a.mu.Lock()
		for _, d := range a.devices {
			if live(d.state) && d.id == id {
				a.mu.Unlock()
				return nil, fmt.Errorf("device %s is the same device as %s", path, d.path)
			}
		}
		a.mu.Unlock()
	}
	f, mem, id, err := mapDevice(path, size)
	if err != nil {
		return nil, fmt.Errorf("map device %s: %w", path, err)
	}
	d := &device{path: path, id: id, state: stateActive, sizeBytes: size, mem: mem, file: f}
	d.maxSlots = int(size / a.slotBytes)
	d.free = make([]int, d.maxSlots)
	for i := range d.free {
		d.free[i] = d.maxSlots - 1 - i // pop from the end: slot 0 first
	}
	a.mu.Lock()
	d.index = len(a.devices)
	a.devices = append(a.devices, d)
	a.updateCapacityLocked()
	a.mu.Unlock()
	return d, nil
}

// MaxSlotsPerDevice bounds a device's slot count: the adapter keeps a free
// list entry (8 bytes) per slot, so a tiny slot_bytes or a huge sparse file
// would otherwise exhaust memory at start or at a /reconfigure instead of
// failing as a configuration error. 2^24 slots is a 16 TiB device at
// 1 MiB slots, a 128 MiB free list.
const MaxSlotsPerDevice = 1 << 24

// checkSlots refuses a device of size bytes with more than
// MaxSlotsPerDevice slots.
func (a *Adapter) checkSlots(path string, size int64) error {
	if n := size / a.slotBytes; n > MaxSlotsPerDevice {
		return fmt.Errorf("device %s: %d bytes is %d slots of %d bytes, more than the %d a device may have; raise slot_bytes", path, size, n, a.slotBytes, MaxSlotsPerDevice)
	}
	return nil
}

func (a *Adapter) updateCapacityLocked() {
	var c int64
	for _, d := range a.devices {
		if live(d.state) {
			c += int64(d.maxSlots) * a.slotBytes
		}
	}
	a.book.SetCapacity(c)
}

// TypeName implements l2.Adapter.
func (a *Adapter) TypeName() string { return TypeName }

var errClosed = fmt.Errorf("dax: %w: closed", l2.ErrUnavailable)

// pickLocked chooses a writable device for a new object: the least full
// first. It returns nil when every writable device is full.
func (a *Adapter) pickLocked(exclude *device) *device {
	var best *device
	var bestFill float64
	for _, d := range a.devices {
		if d == exclude || d.state != stateActive || len(d.free) == 0 {
			continue
		}
		fill := float64(d.liveSlots+d.borrowed) / float64(d.maxSlots)
		if best == nil || fill < bestFill {
			best, bestFill = d, fill
		}
	}
	return best
}

type reservation struct {
	dev  *device
	slot int
	gen  uint64
}

// reserveLocked takes a free slot; the caller copies into it and then
// commits or releases it.
func (a *Adapter) reserveLocked(d *device) reservation {
	s := d.free[len(d.free)-1]
	d.free = d.free[:len(d.free)-1]
	d.borrowed++
	return reservation{dev: d, slot: s, gen: d.gen.Load()}
}

func (a *Adapter) releaseLocked(r reservation) {
	r.dev.borrowed--
	r.dev.freeSlotLocked(r.slot, r.gen)
}

// Store implements l2.Adapter. Slots for every new key are reserved up
// front, so a store that does not fit fails without effect.
func (a *Adapter) Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error {
	if len(keys) != len(objs) {
		return fmt.Errorf("dax: store: %d keys but %d objects", len(keys), len(objs))
	}
	for i, o := range objs {
		if int64(len(o)) > a.slotBytes {
			return fmt.Errorf("dax: store: object %d is %d bytes, larger than slot_bytes %d", i, len(o), a.slotBytes)
		}
	}
	// Held until the listeners have heard of the objects: a delete of
	// these keys in between would remove them and report it first.
	if err := a.book.BeginStore(ctx, keys); err != nil {
		return fmt.Errorf("dax: store: %w", err)
	}
	defer a.book.EndStore(keys)
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return errClosed
	}
	res := make([]reservation, len(keys))
	seen := map[objkey.Key]bool{}
	for i, k := range keys {
		if _, ok := a.index[k]; ok || seen[k] {
			continue // content-addressed: already stored
		}
		seen[k] = true
		d := a.pickLocked(nil)
		if d == nil {
			for _, r := range res[:i] {
				if r.dev != nil {
					a.releaseLocked(r)
					r.dev.inflightStore.Add(-1)
				}
			}
			a.mu.Unlock()
			return fmt.Errorf("dax: store: no free slot for %d objects", len(seen))
		}
		res[i] = a.reserveLocked(d)
		d.inflightStore.Add(1)
	}
	a.mu.Unlock()

	ok := make([]bool, len(keys))
	for i, r := range res {
		if r.dev == nil {
			continue
		}
		r.dev.mapMu.RLock()
		if dst := r.dev.slot(r.slot, a.slotBytes, r.gen); dst != nil {
			copy(dst, objs[i])
			ok[i] = true
		}
		r.dev.mapMu.RUnlock()
		r.dev.inflightStore.Add(-1)
	}
	if a.afterCopy != nil {
		a.afterCopy()
	}

	a.mu.Lock()
	a.waitSweepLocked()
	var failed bool
	var newKeys []objkey.Key
	var newSizes []int64 // object bytes of newKeys, for the listeners
	for i, r := range res {
		if r.dev == nil {
			// Stored before (or earlier in this call): a remove or
			// resize may have dropped it since, and then it must not
			// be reported stored.
			_, still := a.index[keys[i]]
			failed = failed || !still
			continue
		}
		_, dup := a.index[keys[i]]
		if !ok[i] || dup || r.dev.gen.Load() != r.gen || !live(r.dev.state) {
			a.releaseLocked(r)
			failed = failed || !dup
			continue
		}
		r.dev.borrowed--
		a.seq++
		a.index[keys[i]] = loc{dev: r.dev, slot: r.slot, gen: r.gen, size: int64(len(objs[i])), seq: a.seq}
		r.dev.liveSlots++
		newKeys = append(newKeys, keys[i])
		newSizes = append(newSizes, int64(len(objs[i])))
	}
	// Until the report is done no reconfiguration removes keys, so what
	// it reports is what the index holds.
	a.reporting++
	a.mu.Unlock()
	defer a.endReport()
	if a.afterCommit != nil {
		a.afterCommit()
	}
	slotSizes := make([]int64, len(newKeys))
	for i := range slotSizes {
		slotSizes[i] = a.slotBytes // upstream accounts a whole slot per key
	}
	a.book.Stored(newKeys, slotSizes)
	if failed {
		// The objects committed are stored and counted: the listeners
		// (the eviction policy) must hear of them, or they would be
		// counted in usage and never evicted.
		a.book.FireStored(newKeys, newSizes)
		return fmt.Errorf("dax: store: a device changed during the store")
	}
	sizes := make([]int64, len(keys))
	for i := range objs {
		sizes[i] = int64(len(objs[i]))
	}
	a.book.FireStored(keys, sizes)
	return nil
}

// wakeLocked wakes every waiter on settle. Caller holds mu.
func (a *Adapter) wakeLocked() {
	if a.settle != nil {
		close(a.settle)
		a.settle = nil
	}
}

// waitLocked releases mu until the next wakeLocked, then takes it again.
// Caller holds mu.
func (a *Adapter) waitLocked() {
	if a.settle == nil {
		a.settle = make(chan struct{})
	}
	wait := a.settle
	a.mu.Unlock()
	<-wait
	a.mu.Lock()
}

// waitSweepLocked waits until no reconfiguration is removing keys. Caller
// holds mu.
func (a *Adapter) waitSweepLocked() {
	for a.sweeping {
		a.waitLocked()
	}
}

// endReport ends a store's report section.
func (a *Adapter) endReport() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reporting--
	if a.reporting == 0 {
		a.wakeLocked()
	}
}

// beginSweep holds off the commits of stores and waits for the reports of
// those already committed; the caller (holding reconfMu) then removes
// keys, forgets and reports them, and calls endSweep.
func (a *Adapter) beginSweep() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweeping = true
	for a.reporting > 0 {
		a.waitLocked()
	}
}

// endSweep lets stores commit again.
func (a *Adapter) endSweep() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweeping = false
	a.wakeLocked()
}

// LookupAndLock implements l2.Adapter: a hit is an indexed key on a
// readable device.
func (a *Adapter) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	hits := make([]bool, len(keys))
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return hits, errClosed
	}
	for i, k := range keys {
		l, ok := a.index[k]
		hits[i] = ok && readable(l.dev.state)
	}
	// Locked under mu, so a reconfiguration cannot move or drop a hit
	// between the index check and the lock.
	a.book.LockHits(keys, hits)
	a.mu.Unlock()
	return hits, nil
}

// Unlock implements l2.Adapter.
func (a *Adapter) Unlock(keys []objkey.Key) { a.book.Unlock(keys) }

// Load implements l2.Adapter. dst[i] must be exactly the stored size.
func (a *Adapter) Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error) {
	ok := make([]bool, len(keys))
	if len(keys) != len(dst) {
		return ok, fmt.Errorf("dax: load: %d keys but %d buffers", len(keys), len(dst))
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return ok, errClosed
	}
	locs := make([]loc, len(keys))
	found := make([]bool, len(keys))
	for i, k := range keys {
		l, exists := a.index[k]
		if exists && readable(l.dev.state) && l.size == int64(len(dst[i])) {
			locs[i], found[i] = l, true
			l.dev.inflightLoad.Add(1)
		}
	}
	a.mu.Unlock()
	for i, l := range locs {
		if !found[i] {
			continue
		}
		l.dev.mapMu.RLock()
		if src := l.dev.slot(l.slot, a.slotBytes, l.gen); src != nil {
			copy(dst[i], src[:l.size])
			ok[i] = true
		}
		l.dev.mapMu.RUnlock()
		l.dev.inflightLoad.Add(-1)
	}
	// A key deleted, moved or rewritten during the copy may have had its
	// slot reused: only entries that did not change count as loaded.
	a.mu.Lock()
	for i, k := range keys {
		if ok[i] {
			if now, exists := a.index[k]; !exists || now.seq != locs[i].seq {
				ok[i] = false
			}
		}
	}
	a.mu.Unlock()
	return ok, nil
}

// removeLocked drops k from the index and frees its slot.
func (a *Adapter) removeLocked(k objkey.Key) bool {
	l, ok := a.index[k]
	if !ok {
		return false
	}
	delete(a.index, k)
	l.dev.liveSlots--
	l.dev.freeSlotLocked(l.slot, l.gen)
	return true
}

// removeAll removes keys from the index and returns those that were there.
func (a *Adapter) removeAll(keys []objkey.Key) []objkey.Key {
	var removed []objkey.Key
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range keys {
		if a.removeLocked(k) {
			removed = append(removed, k)
		}
	}
	return removed
}

// Delete implements l2.Adapter.
func (a *Adapter) Delete(ctx context.Context, keys []objkey.Key) ([]objkey.Key, error) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, errClosed
	}
	a.mu.Unlock()
	victims := a.book.BeginDelete(keys)
	removed := a.removeAll(victims)
	a.book.EndDelete(victims, removed)
	return removed, nil
}

// List implements l2.Adapter from the in-memory index (upstream's dax
// adapter does not list). Entries are ordered by S3 name; the page token is
// the last name returned, base64url-encoded. Sizes are object bytes.
func (a *Adapter) List(ctx context.Context, modelName string, pageSize int, pageToken string) (l2.Page, error) {
	if pageSize <= 0 {
		pageSize = 1000
	}
	after := ""
	if pageToken != "" {
		b, err := base64.RawURLEncoding.DecodeString(pageToken)
		if err != nil {
			return l2.Page{}, fmt.Errorf("dax: list: %w: %w", l2.ErrBadPageToken, err)
		}
		after = string(b)
	}
	type named struct {
		name string
		e    l2.Entry
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return l2.Page{}, errClosed
	}
	var all []named
	for k, l := range a.index {
		if modelName != "" && k.ModelName != modelName {
			continue
		}
		if n := k.S3Name(); n > after {
			all = append(all, named{n, l2.Entry{Key: k, SizeBytes: l.size}})
		}
	}
	a.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	var p l2.Page
	for i, n := range all {
		if i == pageSize {
			p.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(all[i-1].name))
			break
		}
		p.Entries = append(p.Entries, n.e)
	}
	return p, nil
}

// Usage implements l2.Adapter: slot_bytes per stored key, capacity = the
// sum of live device sizes (rounded down to whole slots).
func (a *Adapter) Usage() l2.Usage { return a.book.Usage() }

// Status implements l2.Adapter.
func (a *Adapter) Status() map[string]any {
	st := a.statusMap()
	st["type"] = "DaxL2Adapter"
	a.mu.Lock()
	st["is_healthy"] = !a.closed
	a.mu.Unlock()
	return st
}

// AddListener implements l2.Adapter.
func (a *Adapter) AddListener(l l2.Listener) { a.book.AddListener(l) }

// Close unmaps every device; copies in flight finish first.
func (a *Adapter) Close() error {
	a.reconfMu.Lock()
	defer a.reconfMu.Unlock()
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	devs := slices.Clone(a.devices)
	for _, d := range devs {
		if live(d.state) {
			d.state = stateClosed
		}
	}
	a.mu.Unlock()
	var errs []error
	for _, d := range devs {
		d.mapMu.Lock()
		if err := d.unmap(); err != nil {
			errs = append(errs, err)
		}
		d.mapMu.Unlock()
	}
	return errors.Join(errs...)
}
