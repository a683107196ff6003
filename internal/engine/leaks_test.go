package engine_test

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestCloseCheckedNamesLeaks: a read lock taken by a LOOKUP and never
// released, and a write staged and never committed, make CloseChecked
// fail with ErrLeaked naming both keys; with everything released it
// returns nil. This is the check every test harness closes its engine
// with, so it must be able to fail.
func TestCloseCheckedNamesLeaks(t *testing.T) {
	key := func(h string) objkey.Key {
		return objkey.Key{ChunkHash: h, ModelName: "m", KVRank: objkey.RankFor(1, 0)}
	}
	locked, staged := key("locked-chunk"), key("staged-chunk")
	for _, leak := range []bool{true, false} {
		e, err := engine.New(engine.Config{L1SizeBytes: 1 << 20}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.ReserveWrite("w", []objkey.Key{locked}, []int64{4096}); err != nil {
			t.Fatal(err)
		}
		if n, err := e.CommitWrite("w", []objkey.Key{locked}); n != 1 || err != nil {
			t.Fatalf("commit = %d, %v", n, err)
		}
		if err := e.Prefetch(engine.PrefetchRequest{ID: "req", Chunks: [][]objkey.Key{{locked}}, Readers: 1}); err != nil {
			t.Fatal(err)
		}
		if res, err := e.PollPrefetch("req"); err != nil || res.PrefixChunks != 1 {
			t.Fatalf("lookup = %+v, %v", res, err)
		}
		if _, err := e.ReserveWrite("w", []objkey.Key{staged}, []int64{4096}); err != nil {
			t.Fatal(err)
		}
		if !leak {
			if n := e.ReleaseRead("req", []objkey.Key{locked}, 1); n != 1 {
				t.Fatalf("released %d, want 1", n)
			}
			if n, err := e.CommitWrite("w", []objkey.Key{staged}); n != 1 || err != nil {
				t.Fatalf("commit = %d, %v", n, err)
			}
		}
		err = e.CloseChecked()
		if !leak {
			if err != nil {
				t.Fatalf("everything released: CloseChecked = %v", err)
			}
			continue
		}
		if !errors.Is(err, engine.ErrLeaked) {
			t.Fatalf("CloseChecked = %v, want ErrLeaked", err)
		}
		// Keys are named in their object-name form: the chunk hash in hex.
		for _, k := range []string{"read lease (resident) m@01000100@0@" + hex.EncodeToString([]byte("locked-chunk")),
			"staged write m@01000100@0@" + hex.EncodeToString([]byte("staged-chunk"))} {
			if !strings.Contains(err.Error(), k) {
				t.Errorf("leak report does not name %s:\n%v", k, err)
			}
		}
		if !strings.Contains(err.Error(), ": 2:\n") {
			t.Errorf("leak report does not count 2 objects:\n%v", err)
		}
	}
}
