package dax

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Sentinel errors of the reconfigure operations; the HTTP layer maps them
// to statuses (Error() is the {"error": ...} message).
var (
	// ErrBadRequest: invalid path, size or mode, or a mapping failure (400).
	ErrBadRequest = errors.New("invalid dax reconfigure request")
	// ErrNotFound: no live device has the path (404).
	ErrNotFound = errors.New("dax device not found")
	// ErrConflict: the device state forbids the operation (409).
	ErrConflict = errors.New("dax reconfigure conflict")
	// ErrHotplugDisabled: the adapter was configured without
	// hotplug_enabled (400; upstream's status is unverified).
	ErrHotplugDisabled = fmt.Errorf("%w: hotplug is disabled for this dax adapter", ErrBadRequest)
)

// Remove and resize modes.
const (
	ModeMigrate = "migrate"
	ModeEvict   = "evict"
	ModeDrain   = "drain"
)

// ReconfigureStatus is upstream's status operation result.
func (a *Adapter) ReconfigureStatus() map[string]any {
	return map[string]any{
		"backend":              "dax",
		"supported_operations": []string{"status", "add", "remove", "resize"},
		"status":               a.statusMap(),
	}
}

func (a *Adapter) statusMap() map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	var capacity, used int64
	locked := a.lockedPerDeviceLocked()
	devs := make([]map[string]any, 0, len(a.devices))
	for _, d := range a.devices {
		if live(d.state) {
			capacity += int64(d.maxSlots) * a.slotBytes
			used += int64(d.liveSlots) * a.slotBytes
		}
		devs = append(devs, a.deviceStatusLocked(d, locked))
	}
	return map[string]any{
		"hotplug_enabled":      a.hotplug,
		"slot_bytes":           a.slotBytes,
		"total_capacity_bytes": capacity,
		"total_used_bytes":     used,
		"devices":              devs,
	}
}

// lockedPerDeviceLocked counts the locked keys on each device. It walks the
// locked keys, not the index: status must not hold mu for a pass over
// every stored key.
func (a *Adapter) lockedPerDeviceLocked() map[*device]int {
	out := map[*device]int{}
	for _, k := range a.book.Locked() {
		if l, ok := a.index[k]; ok {
			out[l.dev]++
		}
	}
	return out
}

func (a *Adapter) deviceStatusLocked(d *device, locked map[*device]int) map[string]any {
	return map[string]any{
		"index":                     d.index,
		"device_id":                 d.id,
		"device_path":               d.path,
		"state":                     d.state,
		"max_dax_size_bytes":        d.sizeBytes,
		"slot_bytes":                a.slotBytes,
		"max_slots":                 d.maxSlots,
		"live_slot_count":           d.liveSlots,
		"free_slot_count":           len(d.free),
		"locked_key_count":          locked[d],
		"borrowed_slot_count":       d.borrowed,
		"inflight_store_tasks":      d.inflightStore.Load(),
		"inflight_lookup_tasks":     0, // lookups finish under mu, which status holds
		"inflight_load_tasks":       d.inflightLoad.Load(),
		"supports_restart_recovery": false,
	}
}

func (a *Adapter) findLocked(path string) *device {
	for _, d := range a.devices {
		if d.path == path && live(d.state) {
			return d
		}
	}
	return nil
}

func (a *Adapter) precheck(path string, size int64, needSize bool) error {
	if !a.hotplug {
		return ErrHotplugDisabled
	}
	if path == "" {
		return fmt.Errorf("%w: device_path must be non-empty", ErrBadRequest)
	}
	if needSize {
		if size <= 0 {
			return fmt.Errorf("%w: size must be positive, got %d", ErrBadRequest, size)
		}
		if size < a.slotBytes {
			return fmt.Errorf("%w: size %d cannot hold one slot of %d bytes", ErrBadRequest, size, a.slotBytes)
		}
		if err := a.checkSlots(path, size); err != nil {
			return fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("%w: adapter closed", ErrConflict)
	}
	return nil
}

// Add maps a new device (upstream "add"). Adding a live path again with
// the same size is an idempotent success; with another size it conflicts.
func (a *Adapter) Add(path string, sizeBytes int64) (map[string]any, error) {
	if err := a.precheck(path, sizeBytes, true); err != nil {
		return nil, err
	}
	a.reconfMu.Lock()
	defer a.reconfMu.Unlock()
	a.mu.Lock()
	if d := a.findLocked(path); d != nil {
		defer a.mu.Unlock()
		if d.sizeBytes != sizeBytes {
			return nil, fmt.Errorf("%w: device %s is already mapped with %d bytes (state %s)", ErrConflict, path, d.sizeBytes, d.state)
		}
		return map[string]any{"status": "ok", "operation": "add", "adapter_index": 0, "device": a.deviceStatusLocked(d, a.lockedPerDeviceLocked())}, nil
	}
	if id, _, err := identity(path); err == nil {
		for _, d := range a.devices {
			if live(d.state) && d.id == id {
				a.mu.Unlock()
				return nil, fmt.Errorf("%w: %s is the same device as %s", ErrConflict, path, d.path)
			}
		}
	}
	a.mu.Unlock()
	d, err := a.addDevice(path, sizeBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return map[string]any{"status": "ok", "operation": "add", "adapter_index": 0, "device": a.deviceStatusLocked(d, a.lockedPerDeviceLocked())}, nil
}

// keysOnLocked lists the keys stored on d, optionally only in slots >= from.
func (a *Adapter) keysOnLocked(d *device, from int) []objkey.Key {
	var keys []objkey.Key
	for k, l := range a.index {
		if l.dev == d && l.slot >= from {
			keys = append(keys, k)
		}
	}
	return keys
}

func (a *Adapter) lockedAmongLocked(keys []objkey.Key) int {
	n := 0
	for _, k := range keys {
		if a.book.LockCount(k) > 0 {
			n++
		}
	}
	return n
}

// freeElsewhereLocked counts free slots on writable devices other than d.
func (a *Adapter) freeElsewhereLocked(d *device) int {
	n := 0
	for _, o := range a.devices {
		if o != d && o.state == stateActive {
			n += len(o.free)
		}
	}
	return n
}

// Remove takes a device out (upstream "remove"). drain only stops writes;
// migrate copies every key to other writable devices, evict deletes them
// (listeners notified); both then unmap the device and mark it removed.
// Locked keys or stores in flight conflict unless force is set. On failure
// the previous state is restored.
func (a *Adapter) Remove(path, mode string, force bool) (map[string]any, error) {
	if mode == "" {
		mode = ModeMigrate
	}
	if err := a.precheck(path, 0, false); err != nil {
		return nil, err
	}
	if mode != ModeMigrate && mode != ModeEvict && mode != ModeDrain {
		return nil, fmt.Errorf("%w: mode must be migrate, evict or drain, got %q", ErrBadRequest, mode)
	}
	a.reconfMu.Lock()
	defer a.reconfMu.Unlock()
	a.mu.Lock()
	d := a.findLocked(path)
	if d == nil {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrNotFound, path)
	}
	prev := d.state
	if mode == ModeDrain {
		d.state = stateDraining
		a.mu.Unlock()
		return map[string]any{"status": "ok", "operation": "drain", "adapter_index": 0, "device_path": path, "index": d.index, "state": stateDraining}, nil
	}
	keys := a.keysOnLocked(d, 0)
	if locked := a.lockedAmongLocked(keys); (locked > 0 || d.borrowed > 0) && !force {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: device %s has %d locked keys and %d borrowed slots; retry later or pass force", ErrConflict, path, locked, d.borrowed)
	}
	if mode == ModeMigrate && a.freeElsewhereLocked(d) < len(keys) {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: insufficient capacity to migrate %d keys off %s", ErrConflict, len(keys), path)
	}
	if mode == ModeMigrate {
		d.state = stateMigrating
	} else {
		d.state = stateRemoving
	}
	a.mu.Unlock()

	result := map[string]any{"status": "ok", "operation": "remove", "adapter_index": 0, "device_path": path, "index": d.index,
		"moved_keys": 0, "moved_bytes": int64(0), "deleted_keys": 0, "source_slots_freed": 0}
	freed := len(keys)
	if mode == ModeMigrate {
		moved, bytes, err := a.relocate(keys, d, func() *device { return a.pickLocked(d) })
		result["moved_keys"], result["moved_bytes"] = moved, bytes
		if err != nil {
			a.restore(d, prev)
			return nil, err
		}
	}
	// From here to the reports no store commits or reports (see
	// Adapter.sweeping): one that committed a key on d and reported it
	// after the key was dropped here had it counted and reported stored
	// after it was deleted.
	a.beginSweep()
	if mode == ModeEvict {
		result["deleted_keys"] = a.evict(d, keys, force)
	}
	a.mu.Lock()
	// Anything still indexed on d (stored concurrently, or skipped by the
	// evict as being stored) is lost.
	lost := a.keysOnLocked(d, 0)
	for _, k := range lost {
		a.removeLocked(k)
	}
	d.state = stateRemoved
	d.free, d.cutFree = nil, nil
	a.updateCapacityLocked()
	d.mapMu.Lock()
	err := d.unmap()
	d.mapMu.Unlock()
	a.mu.Unlock()
	a.book.Forget(lost)
	a.book.FireDeleted(lost)
	a.endSweep()
	if err != nil {
		return nil, fmt.Errorf("%w: unmap %s: %w", ErrBadRequest, path, err)
	}
	result["source_slots_freed"] = freed
	result["state"] = stateRemoved
	return result, nil
}

func (a *Adapter) restore(d *device, state string) {
	a.mu.Lock()
	d.state = state
	a.mu.Unlock()
}

// evict deletes keys still on d (locked ones only with force) and
// notifies listeners. A key deleted and stored again elsewhere since the
// caller listed it stays.
func (a *Adapter) evict(d *device, keys []objkey.Key, force bool) int {
	var victims []objkey.Key
	if force {
		victims = keys
	} else {
		victims = a.book.BeginDelete(keys)
	}
	var removed []objkey.Key
	a.mu.Lock()
	for _, k := range victims {
		if l, ok := a.index[k]; ok && l.dev == d && a.removeLocked(k) {
			removed = append(removed, k)
		}
	}
	a.mu.Unlock()
	if force {
		a.book.Forget(removed)
		a.book.FireDeleted(removed)
	} else {
		a.book.EndDelete(victims, removed)
	}
	return len(removed)
}

// relocate moves keys off src into slots chosen by target (target is
// called with mu held). A key deleted or rewritten meanwhile is skipped. It stops at the
// first key that finds no slot.
func (a *Adapter) relocate(keys []objkey.Key, src *device, target func() *device) (int, int64, error) {
	moved, bytes := 0, int64(0)
	for _, k := range keys {
		a.mu.Lock()
		l, ok := a.index[k]
		if !ok || l.dev != src {
			a.mu.Unlock()
			continue
		}
		dd := target()
		if dd == nil {
			a.mu.Unlock()
			return moved, bytes, fmt.Errorf("%w: insufficient capacity: %d keys could not be moved off %s", ErrConflict, len(keys)-moved, src.path)
		}
		r := a.reserveLocked(dd)
		a.mu.Unlock()

		copied := false
		src.mapMu.RLock()
		if from := src.slot(l.slot, a.slotBytes, l.gen); from != nil {
			if dd != src {
				dd.mapMu.RLock()
			}
			if to := dd.slot(r.slot, a.slotBytes, r.gen); to != nil {
				copy(to, from[:l.size])
				copied = true
			}
			if dd != src {
				dd.mapMu.RUnlock()
			}
		}
		src.mapMu.RUnlock()

		a.mu.Lock()
		now, still := a.index[k]
		if !copied || !still || now.seq != l.seq {
			a.releaseLocked(r)
			a.mu.Unlock()
			continue
		}
		dd.borrowed--
		a.removeLocked(k)
		a.seq++
		a.index[k] = loc{dev: dd, slot: r.slot, gen: r.gen, size: l.size, seq: a.seq}
		dd.liveSlots++
		a.mu.Unlock()
		moved++
		bytes += l.size
	}
	return moved, bytes, nil
}

// Resize changes a device's size (upstream "resize"). Growing remaps;
// shrinking first moves (migrate) or deletes (evict, needs force when keys
// would be lost) the keys in the cut-off slots, then remaps.
func (a *Adapter) Resize(path string, sizeBytes int64, mode string, force bool) (map[string]any, error) {
	if mode == "" {
		mode = ModeMigrate
	}
	if err := a.precheck(path, sizeBytes, true); err != nil {
		return nil, err
	}
	if mode != ModeMigrate && mode != ModeEvict {
		return nil, fmt.Errorf("%w: mode must be migrate or evict, got %q", ErrBadRequest, mode)
	}
	a.reconfMu.Lock()
	defer a.reconfMu.Unlock()
	a.mu.Lock()
	d := a.findLocked(path)
	if d == nil {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrNotFound, path)
	}
	oldSize, prev := d.sizeBytes, d.state
	result := func() map[string]any {
		return map[string]any{"status": "ok", "operation": "resize", "adapter_index": 0, "device_path": path, "index": d.index,
			"old_size_bytes": oldSize, "new_size_bytes": d.sizeBytes, "state": d.state}
	}
	if sizeBytes == oldSize {
		defer a.mu.Unlock()
		return result(), nil
	}
	if prev != stateActive && prev != stateDraining {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: device %s is %s", ErrConflict, path, prev)
	}
	newMax := int(sizeBytes / a.slotBytes)
	oldMax := d.maxSlots
	cut := a.keysOnLocked(d, newMax)
	if newMax < oldMax {
		if locked := a.lockedAmongLocked(cut); (locked > 0 || d.borrowed > 0) && !force {
			a.mu.Unlock()
			return nil, fmt.Errorf("%w: device %s has %d locked keys and %d borrowed slots in the cut-off range; retry later or pass force", ErrConflict, path, locked, d.borrowed)
		}
		if mode == ModeEvict && len(cut) > 0 && !force {
			a.mu.Unlock()
			return nil, fmt.Errorf("%w: shrinking %s would evict %d keys; pass force", ErrConflict, path, len(cut))
		}
		if mode == ModeMigrate {
			room := a.freeElsewhereLocked(d)
			for _, s := range d.free {
				if s < newMax {
					room++
				}
			}
			if room < len(cut) {
				a.mu.Unlock()
				return nil, fmt.Errorf("%w: insufficient capacity to move %d keys out of the cut-off range of %s", ErrConflict, len(cut), path)
			}
		}
		// From here no slot >= newMax is handed out; those freed go to
		// cutFree (freeSlotLocked), so a failed shrink can give back
		// exactly the slots that are free.
		d.maxSlots = newMax
		d.cutFree = slices.DeleteFunc(slices.Clone(d.free), func(s int) bool { return s < newMax })
		d.free = slices.DeleteFunc(d.free, func(s int) bool { return s >= newMax })
	}
	d.state = stateResizing
	a.mu.Unlock()
	if a.beforeMove != nil {
		a.beforeMove()
	}

	fail := func(err error) (map[string]any, error) {
		a.mu.Lock()
		// Not rebuilt from the index: a store still copying into a slot
		// reserved before the resize would find its slot handed out
		// again, and two keys would share one slot.
		d.maxSlots = oldMax
		d.free = append(d.free, d.cutFree...)
		d.cutFree = nil
		d.state = prev
		a.mu.Unlock()
		return nil, err
	}
	if newMax < oldMax && len(cut) > 0 && mode == ModeMigrate {
		_, _, err := a.relocate(cut, d, func() *device {
			if len(d.free) > 0 {
				return d
			}
			return a.pickLocked(d)
		})
		if err != nil {
			return fail(err)
		}
	}
	// From here to the reports no store commits or reports (see
	// Adapter.sweeping).
	a.beginSweep()
	if newMax < oldMax && len(cut) > 0 && mode == ModeEvict {
		a.evict(d, cut, force)
	}
	a.mu.Lock()
	// With force, keys stored or left in the cut-off range are dropped;
	// listeners hear about them after mu is released.
	var lost []objkey.Key
	defer func() {
		a.mu.Unlock()
		a.book.Forget(lost)
		a.book.FireDeleted(lost)
		a.endSweep()
	}()
	for _, k := range a.keysOnLocked(d, newMax) {
		a.removeLocked(k)
		lost = append(lost, k)
	}
	d.cutFree = nil
	d.mapMu.Lock()
	err := d.remap(sizeBytes)
	if err != nil {
		// Try to get the old mapping back so the device stays usable.
		if err2 := d.remap(oldSize); err2 != nil {
			d.state = stateFailed
			d.mapMu.Unlock()
			// Nothing can serve the keys left on d: they are lost, as
			// those of a removed device, and must leave usage, the
			// index and the listeners' view; they stayed counted.
			for _, k := range a.keysOnLocked(d, 0) {
				a.removeLocked(k)
				lost = append(lost, k)
			}
			d.free = nil
			a.updateCapacityLocked()
			return nil, fmt.Errorf("%w: remap %s: %w (restoring: %v)", ErrBadRequest, path, err, err2)
		}
	}
	newGen := d.gen.Load()
	d.mapMu.Unlock()
	// Every live entry of d now points into the new mapping.
	for k, l := range a.index {
		if l.dev == d {
			l.gen = newGen
			a.index[k] = l
		}
	}
	if err != nil {
		d.maxSlots = oldMax
		d.free = a.freeSlotsLocked(d, oldMax)
		d.state = prev
		return nil, fmt.Errorf("%w: remap %s: %w", ErrBadRequest, path, err)
	}
	d.sizeBytes = sizeBytes
	d.maxSlots = newMax
	d.free = a.freeSlotsLocked(d, newMax)
	d.state = prev
	a.updateCapacityLocked()
	return result(), nil
}

// freeSlotsLocked rebuilds d's free list: slots below max not in the index.
func (a *Adapter) freeSlotsLocked(d *device, max int) []int {
	used := make([]bool, max)
	for _, l := range a.index {
		if l.dev == d && l.slot < max {
			used[l.slot] = true
		}
	}
	free := make([]int, 0, max)
	for s := max - 1; s >= 0; s-- {
		if !used[s] {
			free = append(free, s)
		}
	}
	return free
}

// Reconfigure makes the adapter an engine.Reconfigurer, so /reconfigure
// reaches it through the engine like any runtime-manageable backend. op is
// add, remove or resize; args are the validated HTTP body fields
// device_path (string), size_bytes (int64), mode (string) and force (bool).
func (a *Adapter) Reconfigure(_ context.Context, op string, args map[string]any) (map[string]any, error) {
	path, _ := args["device_path"].(string)
	size, _ := args["size_bytes"].(int64)
	mode, _ := args["mode"].(string)
	force, _ := args["force"].(bool)
	switch op {
	case "add":
		return a.Add(path, size)
	case "remove":
		return a.Remove(path, mode, force)
	case "resize":
		return a.Resize(path, size, mode, force)
	}
	return nil, fmt.Errorf("%w: unsupported dax reconfigure operation: %s", ErrBadRequest, op)
}
