package dax_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const slot = l2test.MaxObjectBytes

func devFile(t *testing.T, name string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func newAdapter(t *testing.T, hotplug bool, slots ...int) *dax.Adapter {
	t.Helper()
	cfg := dax.Config{SlotBytes: slot, HotplugEnabled: hotplug}
	for i, n := range slots {
		cfg.Devices = append(cfg.Devices, dax.DeviceConfig{Path: devFile(t, "dax"+string(rune('0'+i))), SizeBytes: int64(n) * slot})
	}
	a, err := dax.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestConformance(t *testing.T) {
	l2test.Run(t, func(t *testing.T) l2.Adapter { return newAdapter(t, false, 64, 64) })
}

func devices(a *dax.Adapter) []map[string]any {
	return a.ReconfigureStatus()["status"].(map[string]any)["devices"].([]map[string]any)
}

func storeN(t *testing.T, a *dax.Adapter, n int) ([]objkey.Key, [][]byte) {
	t.Helper()
	keys, objs := l2test.Keys(t, n, ""), l2test.Objects(t, n)
	if err := a.Store(context.Background(), keys, objs); err != nil {
		t.Fatal(err)
	}
	return keys, objs
}

func TestStoreFullFailsWithoutEffect(t *testing.T) {
	a := newAdapter(t, false, 3)
	defer a.Close()
	storeN(t, a, 2)
	keys := l2test.Keys(t, 2, "")
	if err := a.Store(context.Background(), keys, l2test.Objects(t, 2)); err == nil {
		t.Fatal("store beyond capacity succeeded")
	}
	if hits, _ := a.LookupAndLock(context.Background(), keys); slices.Contains(hits, true) {
		t.Fatalf("partial store: %v", hits)
	}
	u := a.Usage()
	if u.TotalBytesUsed != 2*slot || u.TotalCapacityBytes != 3*slot {
		t.Fatalf("usage = %+v", u)
	}
	if err := a.Store(context.Background(), keys[:1], [][]byte{make([]byte, slot+1)}); err == nil {
		t.Fatal("object larger than a slot stored")
	}
}

func TestHotplugDisabled(t *testing.T) {
	a := newAdapter(t, false, 4)
	defer a.Close()
	if _, err := a.Add(devFile(t, "x"), 4*slot); !errors.Is(err, dax.ErrHotplugDisabled) || !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("Add = %v", err)
	}
	if _, err := a.Remove("x", "drain", false); !errors.Is(err, dax.ErrHotplugDisabled) {
		t.Fatalf("Remove = %v", err)
	}
	if _, err := a.Resize("x", slot, "", false); !errors.Is(err, dax.ErrHotplugDisabled) {
		t.Fatalf("Resize = %v", err)
	}
}

func TestAdd(t *testing.T) {
	a := newAdapter(t, true)
	defer a.Close()
	if a.Usage().TotalCapacityBytes != 0 {
		t.Fatal("capacity without devices")
	}
	p := devFile(t, "d")
	for _, c := range []struct {
		path string
		size int64
	}{{"", slot}, {p, 0}, {p, -1}, {p, slot - 1}, {filepath.Join(t.TempDir(), "missing"), slot}} {
		if _, err := a.Add(c.path, c.size); !errors.Is(err, dax.ErrBadRequest) {
			t.Errorf("Add(%q, %d) = %v, want ErrBadRequest", c.path, c.size, err)
		}
	}
	res, err := a.Add(p, 8*slot)
	if err != nil {
		t.Fatal(err)
	}
	dev := res["device"].(map[string]any)
	if res["status"] != "ok" || res["operation"] != "add" || res["adapter_index"] != 0 || dev["device_path"] != p ||
		dev["state"] != "active" || dev["max_slots"] != 8 || dev["max_dax_size_bytes"] != int64(8*slot) || dev["supports_restart_recovery"] != false {
		t.Fatalf("add result = %v", res)
	}
	if res, err := a.Add(p, 8*slot); err != nil || res["status"] != "ok" {
		t.Fatalf("idempotent add = %v %v", res, err)
	}
	if _, err := a.Add(p, 16*slot); !errors.Is(err, dax.ErrConflict) {
		t.Fatalf("add with another size = %v", err)
	}
	alias := filepath.Join(t.TempDir(), "alias")
	if err := os.Link(p, alias); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Add(alias, 8*slot); !errors.Is(err, dax.ErrConflict) {
		t.Fatalf("add of a hard link to a mapped file = %v", err)
	}
	if got := a.Usage().TotalCapacityBytes; got != 8*slot {
		t.Fatalf("capacity = %d", got)
	}
	keys, objs := storeN(t, a, 3)
	l2test.LoadAll(t, a, keys, objs)
	st := a.ReconfigureStatus()
	if st["backend"] != "dax" || !slices.Equal(st["supported_operations"].([]string), []string{"status", "add", "remove", "resize"}) {
		t.Fatalf("status = %v", st)
	}
	inner := st["status"].(map[string]any)
	if inner["total_used_bytes"] != int64(3*slot) || inner["total_capacity_bytes"] != int64(8*slot) || inner["hotplug_enabled"] != true {
		t.Fatalf("status = %v", inner)
	}
}

func TestRemoveDrain(t *testing.T) {
	a := newAdapter(t, true, 8, 8)
	defer a.Close()
	keys, objs := storeN(t, a, 4)
	d0 := devices(a)[0]["device_path"].(string)
	res, err := a.Remove(d0, "drain", false)
	if err != nil || res["operation"] != "drain" || res["state"] != "draining" || res["index"] != 0 {
		t.Fatalf("drain = %v %v", res, err)
	}
	l2test.LoadAll(t, a, keys, objs) // still readable
	storeN(t, a, 4)
	devs := devices(a)
	if devs[0]["state"] != "draining" || devs[0]["live_slot_count"].(int)+devs[1]["live_slot_count"].(int) != 8 || devs[1]["live_slot_count"].(int) < 4 {
		t.Fatalf("after drain and more stores: %v", devs)
	}
	if _, err := a.Remove("/no/such/dax", "drain", false); !errors.Is(err, dax.ErrNotFound) {
		t.Fatalf("remove unknown = %v", err)
	}
	if _, err := a.Remove(d0, "explode", false); !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("bad mode = %v", err)
	}
}

func TestRemoveMigrate(t *testing.T) {
	a := newAdapter(t, true, 8, 8)
	defer a.Close()
	keys, objs := storeN(t, a, 6)
	d0 := devices(a)[0]
	on0 := d0["live_slot_count"].(int)
	if on0 == 0 {
		t.Fatal("nothing stored on device 0")
	}
	hits, _ := a.LookupAndLock(context.Background(), keys)
	if _, err := a.Remove(d0["device_path"].(string), "migrate", false); !errors.Is(err, dax.ErrConflict) {
		t.Fatalf("remove with locked keys = %v", err)
	}
	if devices(a)[0]["state"] != "active" {
		t.Fatal("state not restored")
	}
	_ = hits
	a.Unlock(keys)
	res, err := a.Remove(d0["device_path"].(string), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if res["operation"] != "remove" || res["state"] != "removed" || res["moved_keys"] != on0 || res["source_slots_freed"] != on0 || res["deleted_keys"] != 0 {
		t.Fatalf("remove result = %v", res)
	}
	l2test.LoadAll(t, a, keys, objs)
	devs := devices(a)
	if devs[0]["state"] != "removed" || devs[1]["live_slot_count"] != 6 {
		t.Fatalf("devices = %v", devs)
	}
	if u := a.Usage(); u.TotalCapacityBytes != 8*slot || u.TotalBytesUsed != 6*slot {
		t.Fatalf("usage = %+v", u)
	}
	// Re-adding the removed path works.
	if _, err := a.Add(d0["device_path"].(string), 8*slot); err != nil {
		t.Fatal(err)
	}
}

func TestRemoveMigrateInsufficient(t *testing.T) {
	a := newAdapter(t, true, 8, 2)
	defer a.Close()
	storeN(t, a, 8)
	devs := devices(a)
	var big string
	for _, d := range devs {
		if d["max_slots"] == 8 {
			big = d["device_path"].(string)
		}
	}
	if _, err := a.Remove(big, "migrate", false); !errors.Is(err, dax.ErrConflict) || !strings.Contains(err.Error(), "insufficient capacity") {
		t.Fatalf("remove = %v", err)
	}
	if devices(a)[0]["state"] != "active" {
		t.Fatal("state not restored")
	}
}

func TestRemoveEvict(t *testing.T) {
	a := newAdapter(t, true, 8)
	defer a.Close()
	rec := l2test.NewRecorder()
	a.AddListener(rec)
	keys, _ := storeN(t, a, 3)
	path := devices(a)[0]["device_path"].(string)
	res, err := a.Remove(path, "evict", false)
	if err != nil || res["deleted_keys"] != 3 {
		t.Fatalf("evict = %v %v", res, err)
	}
	if len(rec.DeletedKeys()) != 3 {
		t.Fatalf("listeners saw %d deletions", len(rec.DeletedKeys()))
	}
	if hits, _ := a.LookupAndLock(context.Background(), keys); slices.Contains(hits, true) {
		t.Fatal("evicted keys still found")
	}
	if u := a.Usage(); u.TotalBytesUsed != 0 || u.TotalCapacityBytes != 0 {
		t.Fatalf("usage = %+v", u)
	}
}

func TestResize(t *testing.T) {
	a := newAdapter(t, true, 4)
	defer a.Close()
	path := devices(a)[0]["device_path"].(string)
	keys, objs := storeN(t, a, 4)
	res, err := a.Resize(path, 10*slot, "migrate", false)
	if err != nil || res["old_size_bytes"] != int64(4*slot) || res["new_size_bytes"] != int64(10*slot) || res["state"] != "active" || res["operation"] != "resize" {
		t.Fatalf("grow = %v %v", res, err)
	}
	l2test.LoadAll(t, a, keys, objs)
	more, moreObjs := storeN(t, a, 5)
	if u := a.Usage(); u.TotalCapacityBytes != 10*slot || u.TotalBytesUsed != 9*slot {
		t.Fatalf("usage = %+v", u)
	}
	if info, _ := os.Stat(path); info.Size() != 10*slot {
		t.Fatalf("file size %d", info.Size())
	}
	if _, err := a.Resize(path, 10*slot, "", false); err != nil {
		t.Fatalf("same size = %v", err)
	}
	// 6 keys left in 10 slots: shrinking to 6 moves those above slot 5 down.
	if _, err := a.Delete(context.Background(), keys[:3]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(path, 6*slot, "migrate", false); err != nil {
		t.Fatalf("shrink migrate: %v", err)
	}
	l2test.LoadAll(t, a, keys[3:], objs[3:])
	l2test.LoadAll(t, a, more, moreObjs)
	if _, err := a.Resize(path, 5*slot, "migrate", false); !errors.Is(err, dax.ErrConflict) {
		t.Fatalf("shrink below contents = %v", err)
	}
	if _, err := a.Resize(path, 5*slot, "evict", false); !errors.Is(err, dax.ErrConflict) {
		t.Fatalf("evicting shrink without force = %v", err)
	}
	l2test.LoadAll(t, a, more, moreObjs)
	rec := l2test.NewRecorder()
	a.AddListener(rec)
	if _, err := a.Resize(path, 4*slot, "evict", true); err != nil {
		t.Fatalf("forced evicting shrink: %v", err)
	}
	if len(rec.DeletedKeys()) != 2 {
		t.Fatalf("forced shrink deleted %d keys, want 2", len(rec.DeletedKeys()))
	}
	all := append(slices.Clone(keys[3:]), more...)
	hits, _ := a.LookupAndLock(context.Background(), all)
	n := 0
	for _, h := range hits {
		if h {
			n++
		}
	}
	a.Unlock(all)
	if n != 4 {
		t.Fatalf("%d keys left after shrinking to 4 slots", n)
	}
	if u := a.Usage(); u.TotalCapacityBytes != 4*slot || u.TotalBytesUsed != 4*slot {
		t.Fatalf("usage = %+v", u)
	}
	if _, err := a.Resize(path, slot-1, "", false); !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("resize below a slot = %v", err)
	}
	if _, err := a.Resize(path, 4*slot, "drain", false); !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("resize with drain = %v", err)
	}
}

// TestReconfigureUnderLoad: stores and loads keep running while the device
// set changes; every load reported as successful has the right bytes.
func TestReconfigureUnderLoad(t *testing.T) {
	a := newAdapter(t, true, 64, 64)
	defer a.Close()
	ctx := context.Background()
	paths := []string{devices(a)[0]["device_path"].(string), devices(a)[1]["device_path"].(string)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loaded atomic.Int64
	errs := make(chan error, 8)
	// progress wakes the waits below after each successful load or error,
	// so they block on events instead of spinning.
	progress := make(chan struct{}, 1)
	poke := func() {
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	// waitLoaded returns once n loads succeeded or a worker failed; it
	// fails the test if neither happens within the deadline.
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	waitLoaded := func(n int64) {
		for loaded.Load() < n && len(errs) == 0 {
			select {
			case <-progress:
			case <-deadline.C:
				close(stop)
				wg.Wait()
				t.Fatalf("%d loads succeeded before the deadline, want %d", loaded.Load(), n)
			}
		}
	}
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				keys, objs := l2test.Keys(t, 4, ""), l2test.Objects(t, 4)
				if err := a.Store(ctx, keys, objs); err != nil {
					continue // a device may be mid-change
				}
				dst := make([][]byte, 4)
				for i := range dst {
					dst[i] = make([]byte, len(objs[i]))
				}
				ok, err := a.Load(ctx, keys, dst)
				if err != nil {
					errs <- err
					poke()
					return
				}
				for i := range ok {
					if ok[i] && !bytes.Equal(dst[i], objs[i]) {
						errs <- errors.New("loaded wrong bytes")
						poke()
						return
					}
					if ok[i] {
						loaded.Add(1)
						poke()
					}
				}
				_, _ = a.Delete(ctx, keys)
			}
		}()
	}
	waitLoaded(50)
	for i := 0; i < 20; i++ {
		_, _ = a.Resize(paths[0], int64(32+i%3*16)*slot, "migrate", true)
		_, _ = a.Resize(paths[1], int64(48-i%2*16)*slot, "evict", true)
	}
	_, _ = a.Remove(paths[0], "migrate", true)
	_, _ = a.Add(paths[0], 16*slot)
	before := loaded.Load()
	waitLoaded(before + 50)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestParseConfig(t *testing.T) {
	spec, err := l2.ParseSpec(1, []byte(`{"type":"dax","slot_bytes":4096,"device_path":"/dev/dax1.0","max_dax_size_gb":2}`))
	if err != nil {
		t.Fatal(err)
	}
	c := spec.Options.(dax.Config)
	if c.SlotBytes != 4096 || len(c.Devices) != 1 || c.Devices[0] != (dax.DeviceConfig{Path: "/dev/dax1.0", SizeBytes: 2 << 30}) || c.HotplugEnabled || c.NumStoreWorkers != 1 {
		t.Fatalf("config = %+v", c)
	}
	spec, err = l2.ParseSpec(1, []byte(`{"type":"dax","slot_bytes":1048576,"hotplug_enabled":true,"num_load_workers":4,
		"devices":[{"device_path":"/d/dax0.0","max_dax_size_gb":64},{"device_path":"/d/dax0.1","max_dax_size_gb":0.5}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c = spec.Options.(dax.Config)
	if len(c.Devices) != 2 || c.Devices[1].SizeBytes != 1<<29 || c.NumLoadWorkers != 4 || !c.HotplugEnabled {
		t.Fatalf("config = %+v", c)
	}
	if _, err := l2.ParseSpec(1, []byte(`{"type":"dax","slot_bytes":4096,"hotplug_enabled":true}`)); err != nil {
		t.Fatalf("no devices with hotplug: %v", err)
	}
	for in, msg := range map[string]string{
		`{"type":"dax","device_path":"/d","max_dax_size_gb":1}`:                                                                          "slot_bytes is required",
		`{"type":"dax","slot_bytes":0,"device_path":"/d","max_dax_size_gb":1}`:                                                           "slot_bytes must be a positive integer",
		`{"type":"dax","slot_bytes":4096}`:                                                                                               "at least one device is required unless hotplug_enabled is true",
		`{"type":"dax","slot_bytes":4096,"device_path":"/d"}`:                                                                            "max_dax_size_gb is required",
		`{"type":"dax","slot_bytes":4096,"max_dax_size_gb":1}`:                                                                           "device_path is required",
		`{"type":"dax","slot_bytes":4096,"devices":[{"device_path":"/d","max_dax_size_gb":0.000001}]}`:                                   "must fit at least one slot",
		`{"type":"dax","slot_bytes":4096,"devices":[{"device_path":"/d","max_dax_size_gb":1},{"device_path":"/d","max_dax_size_gb":1}]}`: "listed twice",
		`{"type":"dax","slot_bytes":4096,"device_path":"/d","max_dax_size_gb":1,"devices":[]}`:                                           "not both",
	} {
		_, err := l2.ParseSpec(1, []byte(in))
		if err == nil || !strings.Contains(err.Error(), "('dax'): ") || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s:\n got %v\nwant %q", in, err, msg)
		}
	}
}

// TestStatusCountsLocksPerDevice: each device reports the locked keys it
// holds; unlocking clears the count.
func TestStatusCountsLocksPerDevice(t *testing.T) {
	a := newAdapter(t, false, 1, 4) // the second store goes to the emptier device
	defer a.Close()
	ctx := context.Background()
	first, _ := storeN(t, a, 1)
	more, _ := storeN(t, a, 3)
	keys := append(first, more...)
	if hits, err := a.LookupAndLock(ctx, keys); err != nil || slices.Contains(hits, false) {
		t.Fatalf("lookup %v %v", hits, err)
	}
	a.LookupAndLock(ctx, keys[:1]) // a second lock on one key counts once
	locked := func() (n0, n1 any) {
		d := devices(a)
		return d[0]["locked_key_count"], d[1]["locked_key_count"]
	}
	if n0, n1 := locked(); n0 != 1 || n1 != 3 {
		t.Fatalf("locked keys per device = %v, %v; want 1, 3", n0, n1)
	}
	a.Unlock(keys)
	a.Unlock(keys[:1])
	if n0, n1 := locked(); n0 != 0 || n1 != 0 {
		t.Fatalf("after unlock = %v, %v", n0, n1)
	}
}
