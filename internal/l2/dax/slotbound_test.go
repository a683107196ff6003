package dax_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/dax"
)

// TestSlotCountBounded: a device of more than MaxSlotsPerDevice slots is a
// configuration error at start, and a 400 at /reconfigure add and resize,
// instead of an 8-bytes-per-slot free list that exhausts memory (here 2^24
// + 1 one-byte slots, 128 MiB; a sparse file of many TiB would be far
// more). The file is never mapped or grown, and a resize leaves the device
// as it was.
func TestSlotCountBounded(t *testing.T) {
	const tooBig = dax.MaxSlotsPerDevice + 1
	path := devFile(t, "huge")
	_, err := dax.New(dax.Config{SlotBytes: 1, Devices: []dax.DeviceConfig{{Path: path, SizeBytes: tooBig}}})
	if err == nil || !strings.Contains(err.Error(), "more than the 16777216 a device may have; raise slot_bytes") {
		t.Fatalf("New with %d one-byte slots: %v, want the slot bound", tooBig, err)
	}
	if info, err := os.Stat(path); err == nil && info.Size() >= tooBig {
		t.Fatalf("the refused device file was grown to %d bytes", info.Size())
	}

	a, err := dax.New(dax.Config{SlotBytes: 1, HotplugEnabled: true, Devices: []dax.DeviceConfig{{Path: devFile(t, "ok"), SizeBytes: 1024}}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Add(devFile(t, "added"), tooBig); !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("add of %d slots: %v, want ErrBadRequest", tooBig, err)
	}
	ok := devices(a)[0]["device_path"].(string)
	if _, err := a.Resize(ok, tooBig, "migrate", false); !errors.Is(err, dax.ErrBadRequest) {
		t.Fatalf("resize to %d slots: %v, want ErrBadRequest", tooBig, err)
	}
	ds := devices(a)
	if len(ds) != 1 || ds[0]["max_dax_size_bytes"] != int64(1024) || ds[0]["max_slots"] != 1024 || ds[0]["state"] != "active" {
		t.Fatalf("devices after the refused add and resize: %v, want the one 1024-byte active device", ds)
	}
}
