package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteReplacesWhole: Write puts the parts in place as one file,
// replacing an older one, and leaves no temporary behind.
func TestWriteReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old content, longer than the new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new "), []byte("content")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "new content" {
		t.Fatalf("file = %q, %v", b, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only state.json", len(entries))
	}
}

// TestDirectoryFsyncFailureIsAnError: when the directory fsync after the
// rename fails, Write reports ErrNotDurable wrapping the cause although the
// new content is in place, and no temporary file is left behind. The code
// this replaced (in the checkpoint and state-file writers) discarded that
// error and reported a durable save.
func TestDirectoryFsyncFailureIsAnError(t *testing.T) {
	injected := errors.New("injected EIO")
	var synced []string
	orig := syncDir
	syncDir = func(dir string) error { synced = append(synced, dir); return injected }
	defer func() { syncDir = orig }()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	err := Write(path, []byte("new "), []byte("content"))
	if !errors.Is(err, injected) || !errors.Is(err, ErrNotDurable) {
		t.Fatalf("Write = %v, want ErrNotDurable wrapping the injected fsync error", err)
	}
	if len(synced) != 1 || synced[0] != dir {
		t.Fatalf("directories fsynced: %q, want [%q]", synced, dir)
	}
	if b, rerr := os.ReadFile(path); rerr != nil || string(b) != "new content" {
		t.Fatalf("file after the failed fsync: %q, %v", b, rerr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only state.json", len(entries))
	}
}

// TestRemoveStaleTemps: the temporaries an interrupted Write left next to
// path are removed and counted; the file itself and another file's
// temporaries in the same directory are kept.
func TestRemoveStaleTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.ckpt")
	for _, name := range []string{"a.ckpt", TempPrefix(path) + "1", TempPrefix(path) + "2", TempPrefix(filepath.Join(dir, "b.json")) + "1"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := RemoveStaleTemps(path)
	if err != nil || n != 2 {
		t.Fatalf("RemoveStaleTemps = %d, %v; want 2, nil", n, err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 2 || names[0] != ".b.json.tmp-1" || names[1] != "a.ckpt" {
		t.Fatalf("left %q, want [.b.json.tmp-1 a.ckpt]", names)
	}
}
