package ledger

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func section(l *Ledger) []byte {
	var e checkpoint.Encoder
	l.AppendCheckpoint(&e)
	return e.Payload()
}

// TestCheckpointRoundTrip: inline keys, a hash longer than 32 bytes and a
// group id beyond 32 bits survive export and import with their sizes, salts
// and per-salt LRU order (the re-export is byte-identical), and a truncated
// section is refused.
func TestCheckpointRoundTrip(t *testing.T) {
	l := New()
	keys := []objkey.Key{
		{ChunkHash: strings.Repeat("a", 32), ModelName: "m1", KVRank: 0, CacheSalt: "s"},
		{ChunkHash: strings.Repeat("b", 40), ModelName: "m2", KVRank: 3, CacheSalt: "s"},
		{ChunkHash: strings.Repeat("c", 32), ModelName: "m1", KVRank: 1, ObjectGroupID: 1 << 40, CacheSalt: "t"},
		{ChunkHash: strings.Repeat("d", 16), ModelName: "m1", KVRank: 0, CacheSalt: ""},
	}
	for i, k := range keys {
		l.Store(FromObjectKey(k), int64(100*(i+1)))
	}
	// Re-store the first key: it moves to the MRU end of salt s.
	l.Store(FromObjectKey(keys[0]), 7)
	first := section(l)
	r := New()
	d := checkpoint.NewDecoder(first)
	if n := r.LoadCheckpoint(d); n != 4 || d.Err() != nil || !d.Done() {
		t.Fatalf("LoadCheckpoint = %d keys, err %v, done %v", n, d.Err(), d.Done())
	}
	if again := section(r); !bytes.Equal(first, again) {
		t.Errorf("re-export differs:\n%x\n%x", first, again)
	}
	wantUsage, wantTotal := l.Usage()
	gotUsage, gotTotal := r.Usage()
	if gotTotal != wantTotal || len(gotUsage) != len(wantUsage) || gotUsage["s"] != 207 || gotUsage["t"] != 300 || gotUsage[""] != 400 {
		t.Errorf("usage after import %v %d, want %v %d", gotUsage, gotTotal, wantUsage, wantTotal)
	}
	bad := checkpoint.NewDecoder(first[:len(first)-3])
	New().LoadCheckpoint(bad)
	if !errors.Is(bad.Err(), checkpoint.ErrCorrupt) {
		t.Errorf("truncated section: %v, want ErrCorrupt", bad.Err())
	}
}
