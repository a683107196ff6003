package fs_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestDefaultsFromJSON: a minimal object has recover_on_start true and
// fsync false; both keys are read from the JSON, strictly typed.
func TestDefaultsFromJSON(t *testing.T) {
	spec, err := l2.ParseSpec(1, []byte(`{"type":"fs","base_path":"/x"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := fs.Config{BasePath: "/x", RecoverOnStart: true, Fsync: false, PersistEnabled: true}
	if got := spec.Options.(fs.Config); got != want {
		t.Fatalf("defaults = %+v\nwant       %+v", got, want)
	}
	spec, err = l2.ParseSpec(1, []byte(`{"type":"fs","base_path":"/x","fsync":true,"recover_on_start":false}`))
	if err != nil {
		t.Fatal(err)
	}
	want = fs.Config{BasePath: "/x", RecoverOnStart: false, Fsync: true, PersistEnabled: true}
	if got := spec.Options.(fs.Config); got != want {
		t.Fatalf("from JSON = %+v\nwant        %+v", got, want)
	}
	_, err = l2.ParseSpec(1, []byte(`{"type":"fs","base_path":"/x","fsync":"yes"}`))
	if want := `invalid --l2-adapter: --l2-adapter #1 ('fs'): fsync must be a boolean, got "yes"`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// TestBasePathCreated: a base_path that does not exist (two levels deep)
// is created at open, and objects are stored in it.
func TestBasePathCreated(t *testing.T) {
	base := filepath.Join(t.TempDir(), "a", "b")
	a := l2test.OpenJSON(t, `{"type":"fs","base_path":"`+base+`"}`)
	fi, err := os.Stat(base)
	if err != nil || !fi.IsDir() {
		t.Fatalf("base_path after open: %v, %v", fi, err)
	}
	k := goldenKey(t, "")
	if err := a.Store(context.Background(), []objkey.Key{k}, [][]byte{[]byte("kv")}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(base, k.FSName()))
	if err != nil || string(b) != "kv" {
		t.Fatalf("stored file: %q, %v", b, err)
	}
}

// TestRecoverOnStartByDefault: without recover_on_start, files already in
// base_path count in usage and are found; with it false they do not count.
func TestRecoverOnStartByDefault(t *testing.T) {
	base := t.TempDir()
	k := goldenKey(t, "")
	if err := os.WriteFile(filepath.Join(base, k.FSName()), []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := l2test.OpenJSON(t, `{"type":"fs","base_path":"`+base+`"}`)
	if got := a.Usage().TotalBytesUsed; got != 5 {
		t.Fatalf("usage with the default = %d, want 5", got)
	}
	keys, sizes := a.(*fs.Adapter).Recovered()
	if len(keys) != 1 || keys[0] != k || len(sizes) != 1 || sizes[0] != 5 {
		t.Fatalf("recovered %v %v", keys, sizes)
	}
	off := l2test.OpenJSON(t, `{"type":"fs","base_path":"`+base+`","recover_on_start":false}`)
	if got := off.Usage().TotalBytesUsed; got != 0 {
		t.Fatalf("usage with recover_on_start false = %d, want 0", got)
	}
}
