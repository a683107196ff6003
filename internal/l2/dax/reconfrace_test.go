package dax_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// indexed reports whether the adapter holds k (a lookup hit).
func indexed(t *testing.T, a *dax.Adapter, k objkey.Key) bool {
	t.Helper()
	hits, err := a.LookupAndLock(context.Background(), []objkey.Key{k})
	if err != nil {
		t.Fatal(err)
	}
	a.Unlock([]objkey.Key{k})
	return hits[0]
}

// reconfigureDuringReport stores one key and runs reconf once the store
// has committed the key but not yet reported it (counted it in usage and
// told the listeners). reconf runs on its own goroutine: a fixed adapter
// holds it off until the report is done, where it used to run in
// between. It returns the stored key.
func reconfigureDuringReport(t *testing.T, a *dax.Adapter, reconf func() error) objkey.Key {
	keys, objs := l2test.Keys(t, 1, ""), l2test.Objects(t, 1)
	done := make(chan error, 1)
	dax.SetAfterCommit(a, func() {
		dax.SetAfterCommit(a, nil)
		go func() { done <- reconf() }()
		// The reconfiguration either finished or is durably blocked
		// waiting for this store's report.
		synctest.Wait()
	})
	if err := a.Store(context.Background(), keys, objs); err != nil {
		t.Fatalf("store: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("reconfigure: %v", err)
	}
	return keys[0]
}

// TestRemoveEvictDuringStoreReport: an evicting remove that dropped a key
// between a store's commit and its report had the key forgotten and
// reported deleted first; the store's late report then counted it in
// usage for good (nothing would ever delete it again) and left listeners
// believing it stored.
func TestRemoveEvictDuringStoreReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAdapter(t, true, 4)
		defer a.Close()
		l := l2test.NewLastEvents()
		a.AddListener(l)
		path := devices(a)[0]["device_path"].(string)
		k := reconfigureDuringReport(t, a, func() error {
			_, err := a.Remove(path, dax.ModeEvict, true)
			return err
		})
		if indexed(t, a, k) {
			t.Fatal("key still indexed on a removed device")
		}
		if u := a.Usage(); u.TotalBytesUsed != 0 {
			t.Fatalf("usage after the only device was removed = %d bytes, want 0", u.TotalBytesUsed)
		}
		if got := l.Of(k); got != "deleted" {
			t.Fatalf("last event for the removed key = %q, want deleted", got)
		}
	})
}

// TestResizeEvictDuringStoreReport: the same race against an evicting
// shrink whose cut-off range holds the key being reported.
func TestResizeEvictDuringStoreReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAdapter(t, true, 4)
		defer a.Close()
		l := l2test.NewLastEvents()
		a.AddListener(l)
		kept, keptObjs := storeN(t, a, 1) // slot 0, below the new size
		path := devices(a)[0]["device_path"].(string)
		k := reconfigureDuringReport(t, a, func() error { // slot 1, cut off
			_, err := a.Resize(path, slot, dax.ModeEvict, true)
			return err
		})
		if indexed(t, a, k) {
			t.Fatal("key of the cut-off range still indexed")
		}
		if u := a.Usage(); u.TotalBytesUsed != slot {
			t.Fatalf("usage after the shrink = %d bytes, want one slot (%d)", u.TotalBytesUsed, slot)
		}
		if got := l.Of(k); got != "deleted" {
			t.Fatalf("last event for the cut-off key = %q, want deleted", got)
		}
		l2test.LoadAll(t, a, kept, keptObjs)
	})
}

// TestRemoveDuringDuplicateStore: a store of a key already stored does
// nothing to it, so a remove that drops the key during that store must
// win: the store used to succeed and tell listeners the key was stored
// after they had heard it deleted.
func TestRemoveDuringDuplicateStore(t *testing.T) {
	a := newAdapter(t, true, 4)
	defer a.Close()
	l := l2test.NewLastEvents()
	a.AddListener(l)
	keys, objs := storeN(t, a, 1)
	path := devices(a)[0]["device_path"].(string)
	dax.SetAfterCopy(a, func() {
		if _, err := a.Remove(path, dax.ModeEvict, true); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	err := a.Store(context.Background(), keys, objs)
	dax.SetAfterCopy(a, nil)
	if err == nil {
		t.Fatal("store of a key removed during the store succeeded")
	}
	if indexed(t, a, keys[0]) {
		t.Fatal("key still indexed on a removed device")
	}
	if got := l.Of(keys[0]); got != "deleted" {
		t.Fatalf("last event for the removed key = %q, want deleted", got)
	}
}

// TestResizeRestoreFailureForgetsDevice: a resize whose new mapping fails
// and whose old mapping cannot be restored leaves the device failed, and
// nothing can serve its keys; they used to stay in usage (so the quota
// stayed used and eviction chased keys that were gone) and listeners were
// never told.
func TestResizeRestoreFailureForgetsDevice(t *testing.T) {
	a := newAdapter(t, true, 4, 4)
	defer a.Close()
	l := l2test.NewLastEvents()
	a.AddListener(l)
	first := devices(a)[0]["device_path"].(string)
	keys, _ := storeN(t, a, 3) // placed by free space: two on one device, one on the other
	onFirst := 0
	for _, d := range devices(a) {
		if d["device_path"] == first {
			onFirst = d["live_slot_count"].(int)
		}
	}
	if onFirst == 0 {
		t.Fatalf("no key on %s: %v", first, devices(a))
	}
	dax.SetMapFault(a, first, func(int64) error { return errors.New("injected map failure") })
	if _, err := a.Resize(first, 8*slot, dax.ModeMigrate, false); !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("Resize with failing maps = %v, want ErrBadRequest", err)
	}
	if st := devices(a)[0]["state"]; st != "failed" {
		t.Fatalf("device state after a failed restore = %v, want failed", st)
	}
	if u, want := a.Usage().TotalBytesUsed, int64(3-onFirst)*slot; u != want {
		t.Fatalf("usage = %d bytes, want %d (only the keys on the healthy device)", u, want)
	}
	lost := 0
	for _, k := range keys {
		hit := indexed(t, a, k)
		switch ev := l.Of(k); {
		case hit && ev != "stored", !hit && ev != "deleted":
			t.Fatalf("key indexed: %v, but its last event was %q", hit, ev)
		}
		if !hit {
			lost++
		}
	}
	if lost != onFirst {
		t.Fatalf("%d keys lost, want the %d on the failed device", lost, onFirst)
	}
}

// TestResizeMigrateFailureKeepsReservedSlot: a migrating shrink that
// fails gives back the slots it had taken out of use. It used to rebuild
// the free list from the index, which does not hold the slots reserved by
// stores still copying; such a slot was handed out again and two keys
// shared it, the later store overwriting the earlier one's bytes.
func TestResizeMigrateFailureKeepsReservedSlot(t *testing.T) {
	a := newAdapter(t, true, 4)
	defer a.Close()
	path := devices(a)[0]["device_path"].(string)
	keys, _ := storeN(t, a, 4) // slots 0..3
	if _, err := a.Delete(context.Background(), keys[3:]); err != nil {
		t.Fatal(err)
	}
	copying, copyingObjs := l2test.Keys(t, 1, "")[:1], l2test.Objects(t, 1)
	var resizeErr error
	dax.SetAfterCopy(a, func() { // the store has reserved slot 3
		dax.SetAfterCopy(a, nil)
		// The shrink to 2 slots must move keys[2] to the one free slot
		// of a second device; a store that takes that slot first makes
		// the move fail.
		if _, err := a.Add(devFile(t, "second"), slot); err != nil {
			t.Errorf("Add: %v", err)
		}
		dax.SetBeforeMove(a, func() {
			dax.SetBeforeMove(a, nil)
			storeN(t, a, 1)
		})
		_, resizeErr = a.Resize(path, 2*slot, dax.ModeMigrate, true)
	})
	if err := a.Store(context.Background(), copying, copyingObjs); err != nil {
		t.Fatalf("store reserving slot 3 during the resize: %v", err)
	}
	if !errors.Is(resizeErr, dax.ErrConflict) {
		t.Fatalf("Resize = %v, want ErrConflict (no room to move)", resizeErr)
	}
	d := devices(a)[0]
	if d["state"] != "active" || d["max_slots"] != 4 || d["live_slot_count"] != 4 || d["free_slot_count"] != 0 {
		t.Fatalf("device after the failed shrink: %v", d)
	}
	later, laterObjs := l2test.Keys(t, 1, ""), l2test.Objects(t, 1)
	if bytes.Equal(laterObjs[0], copyingObjs[0]) {
		t.Fatal("random objects collided")
	}
	if err := a.Store(context.Background(), later, laterObjs); err == nil {
		t.Fatal("store into full devices succeeded: a reserved slot was handed out twice")
	}
	l2test.LoadAll(t, a, copying, copyingObjs)
}
