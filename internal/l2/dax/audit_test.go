package dax_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
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
