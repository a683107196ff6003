package fs_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newAdapter(t *testing.T, mut func(*fs.Config)) *fs.Adapter {
	t.Helper()
	cfg := fs.Config{BasePath: t.TempDir(), RecoverOnStart: true, PersistEnabled: true}
	if mut != nil {
		mut(&cfg)
	}
	a, err := fs.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestConformance(t *testing.T) {
	l2test.Run(t, func(t *testing.T) l2.Adapter { return newAdapter(t, nil) })
}

func TestConformanceTmpDirFsync(t *testing.T) {
	l2test.Run(t, func(t *testing.T) l2.Adapter {
		return newAdapter(t, func(c *fs.Config) { c.RelativeTmpDir = "tmp/w"; c.Fsync = true })
	})
}

var goldenHash, _ = hex.DecodeString("9f2c00ff10e1")

func goldenKey(t *testing.T, salt string) objkey.Key {
	k, err := objkey.New(goldenHash, "Qwen/Qwen3-8B", objkey.RankFor(1, 0), 0, salt)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestGoldenNames: files are named exactly as upstream's fs_key_codec names
// them, and files written under those names by someone else are read back.
func TestGoldenNames(t *testing.T) {
	a := newAdapter(t, nil)
	defer a.Close()
	ctx := context.Background()
	plain, salted := goldenKey(t, ""), goldenKey(t, "user-a")
	if err := a.Store(ctx, []objkey.Key{plain, salted}, [][]byte{[]byte("plain"), []byte("salted")}); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(a.Status()["base_path"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{
		"Qwen-SEP-Qwen3-8B@0x01000100@0@9f2c00ff10e1.data",
		"Qwen-SEP-Qwen3-8B@0x01000100@0@9f2c00ff10e1@user-a.data",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("files = %q\nwant    %q", names, want)
	}
	got, _ := os.ReadFile(filepath.Join(a.Status()["base_path"].(string), want[1]))
	if string(got) != "salted" {
		t.Fatalf("raw file bytes = %q, want the object bytes with no header", got)
	}
}

func TestReadsForeignWrittenFiles(t *testing.T) {
	dir := t.TempDir()
	// As a Python server would leave them: raw bytes, codec names, plus
	// unrelated files that must be ignored.
	files := map[string]string{
		"Qwen-SEP-Qwen3-8B@0x01000100@0@9f2c00ff10e1.data":        "from-python",
		"Qwen-SEP-Qwen3-8B@0x01000100@0@9f2c00ff10e1@user-a.data": "salted-python",
		"README.txt":          "not ours",
		"bad@name.data":       "not ours",
		".lmcache-tmp-abcdef": "torn write",
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := fs.New(fs.Config{BasePath: dir, RecoverOnStart: true, PersistEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	u := a.Usage()
	if u.TotalBytesUsed != int64(len("from-python")+len("salted-python")) || u.BytesByCacheSalt["user-a"] != int64(len("salted-python")) {
		t.Fatalf("recovered usage = %+v", u)
	}
	if keys, _ := a.Recovered(); len(keys) != 2 {
		t.Fatalf("recovered %d keys, want 2", len(keys))
	}
	ctx := context.Background()
	keys := []objkey.Key{goldenKey(t, ""), goldenKey(t, "user-a")}
	hits, err := a.LookupAndLock(ctx, keys)
	if err != nil || !slices.Equal(hits, []bool{true, true}) {
		t.Fatalf("lookup = %v %v", hits, err)
	}
	dst := [][]byte{make([]byte, len("from-python")), make([]byte, len("salted-python"))}
	ok, err := a.Load(ctx, keys, dst)
	if err != nil || !slices.Equal(ok, []bool{true, true}) || string(dst[0]) != "from-python" || string(dst[1]) != "salted-python" {
		t.Fatalf("load = %v %v %q", ok, err, dst)
	}
	// A buffer of the wrong size is a failed load, not a partial one.
	short := [][]byte{make([]byte, 3)}
	ok, _ = a.Load(ctx, keys[:1], short)
	if ok[0] || !bytes.Equal(short[0], make([]byte, 3)) {
		t.Fatalf("size-mismatched load = %v %q", ok, short[0])
	}
	a.Unlock(keys)
	p, err := a.List(ctx, "", 10, "")
	if err != nil || len(p.Entries) != 2 || p.NextPageToken != "" {
		t.Fatalf("list = %+v %v", p, err)
	}
	// The young temp file belongs to a possibly live writer: kept.
	if _, err := os.Stat(filepath.Join(dir, ".lmcache-tmp-abcdef")); err != nil {
		t.Fatalf("young temp file removed: %v", err)
	}
}

func TestStaleTempRemovedAndNoTempLeft(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, ".lmcache-tmp-0011")
	if err := os.WriteFile(stale, []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	a, err := fs.New(fs.Config{BasePath: dir, RecoverOnStart: true, PersistEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale temp file still there: %v", err)
	}
	keys := l2test.Keys(t, 3, "")
	if err := a.Store(context.Background(), keys, l2test.Objects(t, 3)); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".data") {
			t.Errorf("unexpected file after stores: %s", e.Name())
		}
	}
	if len(ents) != 3 {
		t.Fatalf("%d files, want 3", len(ents))
	}
}

func TestStoreFailureLeavesNoObject(t *testing.T) {
	a := newAdapter(t, func(c *fs.Config) { c.RelativeTmpDir = "tmp" })
	defer a.Close()
	base := a.Status()["base_path"].(string)
	// Make the temp directory unusable: the write fails before any rename.
	if err := os.RemoveAll(filepath.Join(base, "tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "tmp"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	keys := l2test.Keys(t, 1, "")
	if err := a.Store(context.Background(), keys, l2test.Objects(t, 1)); err == nil {
		t.Fatal("store succeeded without a temp dir")
	}
	if _, err := os.Stat(a.Path(keys[0])); !os.IsNotExist(err) {
		t.Fatalf("object exists after failed store: %v", err)
	}
	if u := a.Usage(); u.TotalBytesUsed != 0 {
		t.Fatalf("usage after failed store = %d", u.TotalBytesUsed)
	}
}

func TestPersistDisabledRemovesFilesOnClose(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "other.txt")
	_ = os.WriteFile(foreign, []byte("x"), 0o644)
	a, err := fs.New(fs.Config{BasePath: dir, PersistEnabled: false})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Store(context.Background(), l2test.Keys(t, 2, ""), l2test.Objects(t, 2)); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "other.txt" {
		t.Fatalf("after close: %v", ents)
	}
}

func TestParseConfig(t *testing.T) {
	spec, err := l2.ParseSpec(1, []byte(`{"type":"fs","base_path":"/x","relative_tmp_dir":"t","max_capacity_gb":2,"recover_on_start":false,"use_odirect":true,"read_ahead_size":4096,"persist_enabled":false}`))
	if err != nil {
		t.Fatal(err)
	}
	got := spec.Options.(fs.Config)
	want := fs.Config{BasePath: "/x", RelativeTmpDir: "t", MaxCapacityBytes: 2 << 30, ReadAheadSize: 4096, UseODirect: true, PersistEnabled: true}
	if got != want {
		t.Fatalf("config = %+v\nwant     %+v", got, want)
	}
	if spec.PersistEnabled {
		t.Fatal("persist_enabled not parsed")
	}
	for in, msg := range map[string]string{
		`{"type":"fs"}`: "base_path is required",
		`{"type":"fs","base_path":"/x","relative_tmp_dir":"../t"}`: "relative_tmp_dir must be a relative path without '..'",
		`{"type":"fs","base_path":"/x","relative_tmp_dir":"/t"}`:   "relative_tmp_dir must be a relative path",
		`{"type":"fs","base_path":"/x","max_capacity_gb":-1}`:      "max_capacity_gb must be >= 0",
		`{"type":"fs","base_path":"/x","read_ahead_size":0}`:       "read_ahead_size must be a positive integer",
	} {
		_, err := l2.ParseSpec(1, []byte(in))
		if err == nil || !strings.Contains(err.Error(), "--l2-adapter #1 ('fs'): "+msg) {
			t.Errorf("%s: got %v, want %q", in, err, msg)
		}
	}
	a, err := l2.Open(context.Background(), l2.Spec{Index: 1, Type: "fs", PersistEnabled: true, Options: fs.Config{BasePath: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	if a.TypeName() != "fs" {
		t.Fatal(a.TypeName())
	}
	_ = a.Close()
}

// TestStartRemovesInterruptedTemps: temp files that an interrupted write of
// an earlier process on this host left behind are deleted when the adapter
// starts (recover_on_start or not), as are temps older than an hour; temps
// of a live process on this host and young temps of other hosts (a shared
// directory) are kept. Object files are never touched.
func TestStartRemovesInterruptedTemps(t *testing.T) {
	for _, recoverOnStart := range []bool{false, true} {
		dir := t.TempDir()
		// A process that ran and exited: its pid is dead.
		cmd := exec.Command("true")
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		dead := cmd.Process.Pid
		host := fs.TmpHost()
		files := map[string]bool{ // name -> survives start
			fs.TmpPrefix + host + "." + strconv.Itoa(dead) + ".00aa":         false,
			fs.TmpPrefix + host + "." + strconv.Itoa(os.Getppid()) + ".00bb": true, // the parent (go test): live
			fs.TmpPrefix + "otherhost.1.00cc":                                true,
			fs.TmpPrefix + "0011223344556677":                                true,  // the older ownerless form, young
			fs.TmpPrefix + "8899aabbccddeeff":                                false, // ownerless, two hours old
			fs.TmpPrefix + "otherhost.2.00dd":                                false, // other host, two hours old
			goldenKey(t, "s").FSName():                                       true,
		}
		old := time.Now().Add(-2 * time.Hour)
		for name, keep := range files {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte("partial"), 0o644); err != nil {
				t.Fatal(err)
			}
			if !keep && !strings.Contains(name, "."+strconv.Itoa(dead)+".") {
				if err := os.Chtimes(p, old, old); err != nil {
					t.Fatal(err)
				}
			}
		}
		a, err := fs.New(fs.Config{BasePath: dir, RecoverOnStart: recoverOnStart, PersistEnabled: true})
		if err != nil {
			t.Fatal(err)
		}
		for name, keep := range files {
			_, err := os.Stat(filepath.Join(dir, name))
			if got := err == nil; got != keep {
				t.Errorf("recover_on_start=%v: %s exists=%v after start, want %v", recoverOnStart, name, got, keep)
			}
		}
		// A write of this process leaves no temp and names none without its owner.
		k := goldenKey(t, "new")
		if err := a.Store(context.Background(), []objkey.Key{k}, [][]byte{[]byte("payload")}); err != nil {
			t.Fatal(err)
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var temps []string
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), fs.TmpPrefix) {
				temps = append(temps, e.Name())
			}
		}
		slices.Sort(temps)
		want := []string{fs.TmpPrefix + "0011223344556677", fs.TmpPrefix + host + "." + strconv.Itoa(os.Getppid()) + ".00bb", fs.TmpPrefix + "otherhost.1.00cc"}
		slices.Sort(want)
		if !slices.Equal(temps, want) {
			t.Errorf("temps after a store: %q, want %q", temps, want)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadOfAFIFOIsAMissWithoutBlocking: a FIFO under an object's name (put
// there after a lookup saw a regular file) is a miss, and Load returns at
// once: a blocking open would wait for a writer that never comes.
func TestLoadOfAFIFOIsAMissWithoutBlocking(t *testing.T) {
	a := newAdapter(t, nil)
	defer a.Close()
	keys := l2test.Keys(t, 1, "")
	if err := os.MkdirAll(filepath.Dir(a.Path(keys[0])), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(a.Path(keys[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ok  []bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := a.Load(context.Background(), keys, [][]byte{make([]byte, 1)})
		done <- result{ok, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || len(r.ok) != 1 || r.ok[0] {
			t.Fatalf("Load of a FIFO = %v, %v; want [false], nil", r.ok, r.err)
		}
	case <-time.After(10 * time.Second):
		// Unblock the stuck open so the goroutine can end.
		if w, err := os.OpenFile(a.Path(keys[0]), os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		<-done
		t.Fatal("Load of a FIFO blocked for 10s in open")
	}
}
