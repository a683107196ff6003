package fs_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// recordedAdapter is a default adapter with a recorder listening, and two
// keys of salt "salt-a" with their objects; it closes with the test.
func recordedAdapter(t *testing.T) (*fs.Adapter, *l2test.Recorder, []objkey.Key, [][]byte) {
	a := newAdapter(t, nil)
	t.Cleanup(func() { a.Close() })
	rec := l2test.NewRecorder()
	a.AddListener(rec)
	return a, rec, l2test.Keys(t, 2, "salt-a"), l2test.Objects(t, 2)
}

// TestStorePartialFailureCountsWritten: a batch that fails part-way (here
// the second object's name is taken by a directory, as a full disk or a
// foreign file would fail it) has already renamed the first object into
// place. That file is on disk, so it must count in usage and reach the
// listeners (the eviction policy), or it sits there unaccounted and never
// evicted until a restart's recovery finds it.
func TestStorePartialFailureCountsWritten(t *testing.T) {
	a, rec, keys, objs := recordedAdapter(t)
	if err := os.Mkdir(a.Path(keys[1]), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := a.Store(context.Background(), keys, objs); err == nil {
		t.Fatal("store over a directory succeeded")
	}
	if _, err := os.Stat(a.Path(keys[0])); err != nil {
		t.Fatalf("first object not on disk: %v", err)
	}
	u := a.Usage()
	if u.TotalBytesUsed != int64(len(objs[0])) || u.BytesByCacheSalt["salt-a"] != int64(len(objs[0])) {
		t.Fatalf("usage after partial store = %d (salt %d), want the %d bytes written", u.TotalBytesUsed, u.BytesByCacheSalt["salt-a"], len(objs[0]))
	}
	if got := a.Status()["num_objects"]; got != 1 {
		t.Fatalf("num_objects = %v, want 1", got)
	}
	if sz, ok := rec.Stored[keys[0]]; !ok || sz != int64(len(objs[0])) {
		t.Fatalf("listener not told of the written object (stored %v)", rec.Stored)
	}
	if _, ok := rec.Stored[keys[1]]; ok {
		t.Fatal("listener told of the object that failed")
	}
}

// TestRecoveredShortFileRewritten: a file recovered under an object's name
// but shorter than the object (torn by a power loss without fsync, or
// written by a foreign tool) is replaced when the object is stored again;
// usage must then count the new file's size, not the recovered one's.
func TestRecoveredShortFileRewritten(t *testing.T) {
	dir := t.TempDir()
	keys := l2test.Keys(t, 1, "salt-a")
	objs := l2test.Objects(t, 1)
	a := newAdapter(t, func(c *fs.Config) { c.BasePath = dir })
	if err := os.WriteFile(a.Path(keys[0]), objs[0][:10], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = newAdapter(t, func(c *fs.Config) { c.BasePath = dir })
	defer a.Close()
	if u := a.Usage(); u.TotalBytesUsed != 10 {
		t.Fatalf("recovered usage = %d, want 10", u.TotalBytesUsed)
	}
	if err := a.Store(context.Background(), keys, objs); err != nil {
		t.Fatal(err)
	}
	want := int64(len(objs[0]))
	if u := a.Usage(); u.TotalBytesUsed != want || u.BytesByCacheSalt["salt-a"] != want {
		t.Fatalf("usage after rewrite = %d (salt %d), want %d", u.TotalBytesUsed, u.BytesByCacheSalt["salt-a"], want)
	}
	if _, err := a.Delete(context.Background(), keys); err != nil {
		t.Fatal(err)
	}
	if u := a.Usage(); u.TotalBytesUsed != 0 || len(u.BytesByCacheSalt) != 0 {
		t.Fatalf("usage after delete = %+v, want 0", u)
	}
}

// TestDeleteForgetsVanishedFile: an object this adapter counts whose file
// is gone (removed by another server sharing base_path, or by hand) is
// dropped from usage and reported deleted when it is deleted. Kept, its
// bytes stayed in usage for good and the eviction policy picked it again
// every cycle, so usage could stay over the watermark with nothing left to
// evict.
func TestDeleteForgetsVanishedFile(t *testing.T) {
	a, rec, keys, objs := recordedAdapter(t)
	if err := a.Store(context.Background(), keys, objs); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(a.Path(keys[0])); err != nil {
		t.Fatal(err)
	}
	deleted, err := a.Delete(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(deleted) != 2 || len(rec.DeletedKeys()) != 2 {
		t.Fatalf("Delete returned %v and notified %v, want both keys", deleted, rec.DeletedKeys())
	}
	if u := a.Usage(); u.TotalBytesUsed != 0 || len(u.BytesByCacheSalt) != 0 {
		t.Fatalf("usage after deleting a vanished file = %+v, want 0", u)
	}
	// A key this adapter never counted is still not reported.
	other := l2test.Keys(t, 1, "")
	if deleted, err := a.Delete(context.Background(), other); err != nil || len(deleted) != 0 {
		t.Fatalf("Delete of an unknown missing key = %v, %v; want none", deleted, err)
	}
}

// TestStartRemovesBaseTempsWithTmpDir: a server restarted with
// relative_tmp_dir set after running without it still removes the temp
// files its interrupted writes left in base_path (the default place for
// them). Only the temp directory was scanned, and recovery skips temp
// names, so they held disk space outside usage for good.
func TestStartRemovesBaseTempsWithTmpDir(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, fs.TmpPrefix+fs.TmpHost()+"."+strconv.Itoa(cmd.Process.Pid)+".00aa")
	if err := os.WriteFile(stale, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The parent (go test) is a live process on this host.
	live := filepath.Join(dir, fs.TmpPrefix+fs.TmpHost()+"."+strconv.Itoa(os.Getppid())+".00bb")
	if err := os.WriteFile(live, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := newAdapter(t, func(c *fs.Config) { c.BasePath = dir; c.RelativeTmpDir = "tmp" })
	defer a.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("temp of a dead process in base_path survived the start: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("temp of a live process removed: %v", err)
	}
}

// TestFsyncSyncsDirectoryAfterRename: with fsync, each stored object's
// directory entry is made durable too (the directory is synced after the
// rename): syncing only the file left its name to the page cache, so a
// power loss could lose an object the store reported written.
func TestFsyncSyncsDirectoryAfterRename(t *testing.T) {
	for _, tmpDir := range []string{"", "tmp"} {
		a := newAdapter(t, func(c *fs.Config) { c.Fsync = true; c.RelativeTmpDir = tmpDir })
		base := a.Status()["base_path"].(string)
		var synced []string
		fs.SetDirSynced(a, func(dir string) { synced = append(synced, dir) })
		keys := l2test.Keys(t, 2, "")
		if err := a.Store(context.Background(), keys, l2test.Objects(t, 2)); err != nil {
			t.Fatal(err)
		}
		if len(synced) != 2 || synced[0] != base || synced[1] != base {
			t.Fatalf("relative_tmp_dir %q: directories synced %q, want base_path %q once per object", tmpDir, synced, base)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecoverSkipsNonCanonicalNames: the FS name parser is as lenient as
// upstream's (upper-case hex, "0X" prefixes), so a foreign file can parse
// to a key whose own file name is another. Such a file is not the key's
// object: lookups and loads of the key open the canonical name and miss,
// and a delete of the key cannot remove it. Adopted, it was counted in
// usage (for good, since no delete reached it) and listed under a key
// that does not address it; it is now skipped like any name that is no
// object's.
func TestRecoverSkipsNonCanonicalNames(t *testing.T) {
	dir := t.TempDir()
	k := goldenKey(t, "")
	canonical := k.FSName()
	upper := strings.Replace(canonical, "9f2c00ff10e1", "9F2C00FF10E1", 1)
	if upper == canonical {
		t.Fatalf("golden name %q has no lower-case hash to change", canonical)
	}
	if err := os.WriteFile(filepath.Join(dir, upper), []byte("foreign"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := newAdapter(t, func(c *fs.Config) { c.BasePath = dir })
	defer a.Close()
	if u := a.Usage(); u.TotalBytesUsed != 0 {
		t.Fatalf("usage %d after recovering only a non-canonical name, want 0", u.TotalBytesUsed)
	}
	if keys, _ := a.Recovered(); len(keys) != 0 || a.RecoverSkipped() != 1 {
		t.Fatalf("recovered %v, skipped %d; want none recovered and 1 skipped", keys, a.RecoverSkipped())
	}
	page, err := a.List(context.Background(), "", 10, "")
	if err != nil || len(page.Entries) != 0 {
		t.Fatalf("List = %+v, %v; want no entries", page, err)
	}
	if _, err := os.Stat(filepath.Join(dir, upper)); err != nil {
		t.Fatalf("foreign file not left on disk: %v", err)
	}
}
