package dax_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
)

// TestNewRefusesSameDeviceTwice: two configured devices that are one file
// (a symlink, a hard link, "dir/./f") mapped the same bytes twice, and each
// handed out its slot 0 to a different key, so a load returned another
// key's bytes as loaded. ParseConfig only compares path strings; New must
// compare device identity, as Add does.
func TestNewRefusesSameDeviceTwice(t *testing.T) {
	p := devFile(t, "dax0")
	alias := filepath.Join(t.TempDir(), "alias")
	if err := os.Symlink(p, alias); err != nil {
		t.Fatal(err)
	}
	a, err := dax.New(dax.Config{SlotBytes: slot, Devices: []dax.DeviceConfig{
		{Path: p, SizeBytes: 2 * slot},
		{Path: alias, SizeBytes: 2 * slot},
	}})
	if err == nil {
		// Show what the old code did with it: two keys in one slot.
		defer a.Close()
		keys, objs := l2test.Keys(t, 2, ""), l2test.Objects(t, 2)
		if err := a.Store(context.Background(), keys, objs); err != nil {
			t.Fatal(err)
		}
		dst := [][]byte{make([]byte, len(objs[0])), make([]byte, len(objs[1]))}
		ok, _ := a.Load(context.Background(), keys, dst)
		t.Fatalf("New mapped %s and its alias %s as two devices; loads ok=%v, bytes intact=[%v %v]",
			p, alias, ok, bytes.Equal(dst[0], objs[0]), bytes.Equal(dst[1], objs[1]))
	}
	if !strings.Contains(err.Error(), "same device") {
		t.Fatalf("New error = %v, want it to name the same device", err)
	}
}
