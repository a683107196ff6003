package statefile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

func TestSaveLoadAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.json")
	st, err := Load(path)
	if err != nil || len(st.Quotas) != 0 || st.DefaultLimitBytes != nil {
		t.Fatalf("missing file: %+v %v", st, err)
	}
	w := NewWriter(path)
	zero := int64(0)
	want := State{DefaultLimitBytes: &zero, Quotas: map[string]int64{"a": 5, "": 7},
		Pins: []Pin{{Key: objkey.Encoded{ChunkHashHex: "aa", ModelName: "m", KVRank: 1, CacheSalt: "s"}, Count: 2}}}
	if err := w.Save(func() State { return want }); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if *got.DefaultLimitBytes != 0 || got.Quotas["a"] != 5 || got.Quotas[""] != 7 || len(got.Pins) != 1 || got.Pins[0].Count != 2 || got.Pins[0].Key.ChunkHashHex != "aa" {
		t.Fatalf("round trip %+v", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("leftover files %v", entries)
	}
	if err := os.WriteFile(path, []byte(`{"version":99}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Fatal("unknown version accepted")
	}
}
