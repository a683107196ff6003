package dax_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
)

// 2^-16 GiB = 16384 bytes, exact in binary floating point.
const tinyGiB = "0.0000152587890625"

func openDaxJSON(t *testing.T, js string) (l2.Adapter, error) {
	t.Helper()
	spec, err := l2.ParseSpec(1, []byte(js))
	if err != nil {
		t.Fatal(err)
	}
	a, err := l2.Open(context.Background(), spec)
	if err == nil {
		t.Cleanup(func() { _ = a.Close() })
	}
	return a, err
}

// TestObjectLargerThanSlotRefused: an object of slot_bytes fits; one byte
// more fails the whole store, with nothing stored.
func TestObjectLargerThanSlotRefused(t *testing.T) {
	a := newAdapter(t, false, 4)
	defer a.Close()
	ctx := context.Background()
	keys := l2test.Keys(t, 2, "")
	err := a.Store(ctx, keys, [][]byte{make([]byte, slot), make([]byte, slot+1)})
	want := fmt.Sprintf("dax: store: object 1 is %d bytes, larger than slot_bytes %d", slot+1, slot)
	if err == nil || err.Error() != want {
		t.Fatalf("store: %v, want %q", err, want)
	}
	hits, err := a.LookupAndLock(ctx, keys)
	if err != nil || hits[0] || hits[1] {
		t.Fatalf("after the refused store: hits %v, %v", hits, err)
	}
	if u := a.Usage(); u.TotalBytesUsed != 0 {
		t.Fatalf("usage after the refused store = %+v", u)
	}
	if err := a.Store(ctx, keys[:1], [][]byte{make([]byte, slot)}); err != nil {
		t.Fatalf("object of exactly slot_bytes: %v", err)
	}
}

// TestShortFileExtended: a plain file shorter than max_dax_size_gb is
// extended to that size at open.
func TestShortFileExtended(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dax0")
	if err := os.WriteFile(p, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := openDaxJSON(t, `{"type":"dax","slot_bytes":4096,"device_path":"`+p+`","max_dax_size_gb":`+tinyGiB+`}`)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != 16384 {
		t.Fatalf("file after open: %v, %v; want 16384 bytes", fi, err)
	}
	if u := a.Usage(); u.TotalCapacityBytes != 16384 {
		t.Fatalf("capacity = %d, want 16384", u.TotalCapacityBytes)
	}
	k := l2test.Keys(t, 1, "")
	if err := a.Store(context.Background(), k, [][]byte{[]byte("kv")}); err != nil {
		t.Fatal(err)
	}
}

// TestMissingDevicePathIsError: a path that does not exist fails the open
// and is not created.
func TestMissingDevicePathIsError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "missing")
	_, err := openDaxJSON(t, `{"type":"dax","slot_bytes":4096,"device_path":"`+p+`","max_dax_size_gb":`+tinyGiB+`}`)
	want := "--l2-adapter #1 ('dax'): dax: map device " + p + ": no such file or directory"
	if err == nil || err.Error() != want {
		t.Fatalf("open: %v\nwant %q", err, want)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("missing path was created: %v", err)
	}
}

// TestWorkerCountsValidated: each worker count defaults (1, 1, min(4,
// NumCPU)) and must be a positive integer.
func TestWorkerCountsValidated(t *testing.T) {
	spec, err := l2.ParseSpec(1, []byte(`{"type":"dax","slot_bytes":4096,"hotplug_enabled":true}`))
	if err != nil {
		t.Fatal(err)
	}
	c := spec.Options.(dax.Config)
	if c.NumStoreWorkers != 1 || c.NumLookupWorkers != 1 || c.NumLoadWorkers != min(4, runtime.NumCPU()) {
		t.Fatalf("defaults: %+v", c)
	}
	for _, key := range []string{"num_store_workers", "num_lookup_workers", "num_load_workers"} {
		for _, v := range []string{"0", "-2"} {
			_, err := l2.ParseSpec(1, []byte(`{"type":"dax","slot_bytes":4096,"hotplug_enabled":true,"`+key+`":`+v+`}`))
			want := "invalid --l2-adapter: --l2-adapter #1 ('dax'): " + key + " must be a positive integer, got " + v
			if err == nil || err.Error() != want {
				t.Errorf("%s=%s: %v\nwant %q", key, v, err, want)
			}
		}
	}
}
