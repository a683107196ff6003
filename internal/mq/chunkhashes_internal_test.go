package mq

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestChunkHashesRefusesOutOfRangeIDs: a token id outside uint32 is
// refused with the index of the first one, whether the chunks before it
// were hashed now or come from the request's session or the prefix cache
// (which only compares ids, so it must never let a bad one through).
func TestChunkHashesRefusesOutOfRangeIDs(t *testing.T) {
	const chunk = 4
	s := &Server{cfg: Config{ChunkSize: chunk, PrefixHashChunks: 64}, log: slog.New(slog.DiscardHandler)}
	var err error
	if s.hasher, err = tokenhash.New(tokenhash.Blake3, chunk); err != nil {
		t.Fatal(err)
	}
	st := newState(s)
	good := []wire.Int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	k := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: good, End: 12, RequestID: "r"}
	if h, err := st.chunkHashes(k, 3); err != nil || len(h) != 3 {
		t.Fatalf("valid ids: %d hashes, %v", len(h), err)
	}
	for _, c := range []struct {
		at  int
		v   wire.Int
		req string
	}{
		{9, -1, "r"},         // behind two chunks the session holds
		{9, 1 << 32, "new"},  // behind two chunks the prefix cache holds
		{1, 1 << 32, "new2"}, // in the first chunk
		{5, -7, "new3"},      // in a chunk that a cached one would match but for it
	} {
		ids := append([]wire.Int(nil), good...)
		ids[c.at] = c.v
		k := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: ids, End: 12, RequestID: c.req}
		_, err := st.chunkHashes(k, 3)
		want := fmt.Sprintf("token_ids[%d]=%d", c.at, c.v)
		if !errors.Is(err, tokenhash.ErrTokenRange) || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("id %d at %d (request %s): %v; want ErrTokenRange naming %s", c.v, c.at, c.req, err, want)
		}
	}
}
