package dax_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestResizeRemapFailureKeepsDevice: a grow that cannot be mapped (a size
// past what the file system or the address space allows) must put the old
// mapping back, as Resize promises, and leave the device active with its
// objects readable. The restore used to unmap the already unmapped region
// first, which always failed, so the device ended "failed" with every
// object on it lost.
func TestResizeRemapFailureKeepsDevice(t *testing.T) {
	a := newAdapter(t, true, 4)
	defer a.Close()
	keys, objs := storeN(t, a, 2)
	path := devices(a)[0]["device_path"].(string)
	_, err := a.Resize(path, 1<<60, dax.ModeMigrate, false)
	if !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("Resize to 2^60 bytes = %v, want ErrBadRequest", err)
	}
	d := devices(a)[0]
	if d["state"] != "active" || d["max_dax_size_bytes"] != int64(4*slot) || d["max_slots"] != 4 || d["free_slot_count"] != 2 {
		t.Fatalf("device after failed resize: %v", d)
	}
	l2test.LoadAll(t, a, keys, objs)
	more, moreObjs := l2test.Keys(t, 2, ""), l2test.Objects(t, 2)
	if err := a.Store(context.Background(), more, moreObjs); err != nil {
		t.Fatalf("store after failed resize: %v", err)
	}
	l2test.LoadAll(t, a, more, moreObjs)
}

// TestStoreFullLeavesNoInflightStores: a store refused for want of slots
// hands back the slots it had reserved and must also drop them from
// inflight_store_tasks; the count used to keep them for good, so /status
// showed stores in flight on an idle device.
func TestStoreFullLeavesNoInflightStores(t *testing.T) {
	a := newAdapter(t, false, 3)
	defer a.Close()
	keys := l2test.Keys(t, 4, "")
	if err := a.Store(context.Background(), keys, l2test.Objects(t, 4)); err == nil {
		t.Fatal("store beyond capacity succeeded")
	}
	d := devices(a)[0]
	if d["inflight_store_tasks"] != int64(0) || d["borrowed_slot_count"] != 0 || d["free_slot_count"] != 3 {
		t.Fatalf("device after refused store: %v", d)
	}
}

// TestStoreDeviceRemovedMidStoreNotifiesCommitted: a store that loses one
// object to a device removed during its copies still commits the others;
// those count in usage and must reach the listeners (the eviction policy),
// which used to hear nothing, so they were counted but never evicted.
func TestStoreDeviceRemovedMidStoreNotifiesCommitted(t *testing.T) {
	a := newAdapter(t, true, 2, 2)
	defer a.Close()
	rec := l2test.NewRecorder()
	a.AddListener(rec)
	second := devices(a)[1]["device_path"].(string)
	dax.SetAfterCopy(a, func() {
		if _, err := a.Remove(second, dax.ModeEvict, true); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	keys, objs := l2test.Keys(t, 2, ""), l2test.Objects(t, 2)
	if err := a.Store(context.Background(), keys, objs); err == nil {
		t.Fatal("store across a removed device succeeded")
	}
	dax.SetAfterCopy(a, nil)
	hits, err := a.LookupAndLock(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	a.Unlock(keys)
	committed := 0
	for i, h := range hits {
		if !h {
			continue
		}
		committed++
		if sz, ok := rec.Stored[keys[i]]; !ok || sz != int64(len(objs[i])) {
			t.Fatalf("committed object %d not reported to listeners (stored %v)", i, rec.Stored)
		}
	}
	if committed != 1 || len(rec.Stored) != 1 {
		t.Fatalf("committed %d objects, listeners told of %d; want 1 and 1", committed, len(rec.Stored))
	}
	if u := a.Usage(); u.TotalBytesUsed != slot {
		t.Fatalf("usage = %d, want one slot", u.TotalBytesUsed)
	}
}

// blockStored blocks in its first OnStored until release is closed and
// records the last event per key.
type blockStored struct {
	mu      sync.Mutex
	last    map[objkey.Key]string
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func (l *blockStored) record(kind string, keys []objkey.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.last[k] = kind
	}
}

func (l *blockStored) OnStored(keys []objkey.Key, _ []int64) {
	l.once.Do(func() { close(l.reached); <-l.release })
	l.record("stored", keys)
}
func (l *blockStored) OnAccessed([]objkey.Key)     {}
func (l *blockStored) OnDeleted(keys []objkey.Key) { l.record("deleted", keys) }

// TestDeleteDuringStoreReportOrder: a delete of a key whose store has
// committed but not yet reported it used to remove the object and report
// the deletion first; the store's late report then left listeners (the
// eviction policy, the coordinator) tracking an object that was gone,
// and no later delete would report it. The delete now skips a key being
// stored, so the last event matches the index.
func TestDeleteDuringStoreReportOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAdapter(t, false, 4)
		defer a.Close()
		l := &blockStored{last: map[objkey.Key]string{}, reached: make(chan struct{}), release: make(chan struct{})}
		a.AddListener(l)
		keys, objs := l2test.Keys(t, 1, ""), l2test.Objects(t, 1)
		stored := make(chan error, 1)
		go func() { stored <- a.Store(context.Background(), keys, objs) }()
		<-l.reached
		deleted := make(chan error, 1)
		go func() {
			_, err := a.Delete(context.Background(), keys)
			deleted <- err
		}()
		synctest.Wait()
		close(l.release)
		if err := <-stored; err != nil {
			t.Fatal(err)
		}
		if err := <-deleted; err != nil {
			t.Fatal(err)
		}
		hits, err := a.LookupAndLock(context.Background(), keys)
		if err != nil {
			t.Fatal(err)
		}
		a.Unlock(keys)
		if want := map[bool]string{true: "stored", false: "deleted"}[hits[0]]; l.last[keys[0]] != want {
			t.Fatalf("object stored: %v, but the last event listeners heard was %q", hits[0], l.last[keys[0]])
		}
	})
}
