package mq

import (
	"log/slog"
	"testing"

	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// BenchmarkLookupKeys measures the server-side key work of one LOOKUP (or
// PREPARE/COMMIT) of a 32k-token prompt at TP=2: token ids to chunk hashes
// to object keys. "hash" is the baseline, blake3 over the tokens alone;
// "cold" is a request's first call (no session), "warm" a later call of the
// same request, which compares the tokens with the session and reuses its
// hashes; "shared" is a request's first call whose prompt another request
// hashed before (no session; the prefix cache has every chunk). Compare
// them with hash in the same run.
func BenchmarkLookupKeys(b *testing.B) {
	const chunk, tokens = 256, 32768
	s := &Server{cfg: Config{ChunkSize: chunk, PrefixHashChunks: Defaults().PrefixHashChunks}, log: slog.New(slog.DiscardHandler)}
	var err error
	if s.hasher, err = tokenhash.New(tokenhash.Blake3, chunk); err != nil {
		b.Fatal(err)
	}
	st := newState(s)
	ids := make([]wire.Int, tokens)
	u32 := make([]uint32, tokens)
	for i := range ids {
		ids[i] = wire.Int(i * 7919 % 128000)
		u32[i] = uint32(ids[i])
	}
	k := &wire.Key{ModelName: "m", WorldSize: 2, TokenIDs: ids, End: tokens, RequestID: "r"}
	keys := func() {
		hashes, err := st.chunkHashes(k, tokens/chunk)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(objectKeys(k.ModelName, 2, "", hashes, -1)); n != 2*tokens/chunk {
			b.Fatalf("%d keys", n)
		}
	}
	b.Run("hash", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.hasher.ChunkHashesU32(u32)
		}
	})
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			delete(st.sessions, "r")
			// Emptied, not replaced: a running server's maps are grown.
			clear(st.prefixes.cur)
			clear(st.prefixes.old)
			keys()
		}
	})
	b.Run("shared", func(b *testing.B) {
		b.ReportAllocs()
		keys()
		for b.Loop() {
			delete(st.sessions, "r")
			keys()
		}
	})
	b.Run("warm", func(b *testing.B) {
		b.ReportAllocs()
		keys()
		for b.Loop() {
			keys()
		}
	})
}
