package statefile

import (
	"errors"
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

// TestLoadRefusesOutOfRangeValues: a well-formed file whose values no API
// call can set (a negative quota or default limit, a pin count below 1) is
// corrupt, as an unknown version is, instead of being restored: a negative
// limit makes every eviction cycle evict that salt, and a zero count pin
// was dropped without a word.
func TestLoadRefusesOutOfRangeValues(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.json")
	pin := func(n string) string {
		return `[{"key":{"chunk_hash_hex":"aa","model_name":"m","kv_rank":0,"object_group_id":0,"cache_salt":""},"count":` + n + `}]`
	}
	for name, doc := range map[string]string{
		"negative quota":   `{"version":1,"default_limit_bytes":null,"quotas":{"a":-1},"pins":[]}`,
		"negative default": `{"version":1,"default_limit_bytes":-5,"quotas":{},"pins":[]}`,
		"zero pin count":   `{"version":1,"default_limit_bytes":null,"quotas":{},"pins":` + pin("0") + `}`,
		"negative pin":     `{"version":1,"default_limit_bytes":null,"quotas":{},"pins":` + pin("-3") + `}`,
	} {
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if st, err := Load(path); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Load = %+v, %v; want ErrCorrupt", name, st, err)
		}
	}
	ok := `{"version":1,"default_limit_bytes":0,"quotas":{"a":0},"pins":` + pin("1") + `}`
	if err := os.WriteFile(path, []byte(ok), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := Load(path); err != nil || st.Quotas["a"] != 0 || *st.DefaultLimitBytes != 0 || st.Pins[0].Count != 1 {
		t.Fatalf("zero limits and a count of 1: %+v, %v", st, err)
	}
}
