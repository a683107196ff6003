package mq

import (
	"bytes"
	"fmt"
	"log/slog"
	"testing"

	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// prefixState is a protocol state over a blake3 hasher with chunk size 4
// and a prefix cache of cacheChunks chunks.
func prefixState(t *testing.T, cacheChunks int) *state {
	t.Helper()
	s := &Server{cfg: Config{ChunkSize: 4, PrefixHashChunks: cacheChunks}, log: slog.New(slog.DiscardHandler)}
	var err error
	if s.hasher, err = tokenhash.New(tokenhash.Blake3, 4); err != nil {
		t.Fatal(err)
	}
	return newState(s)
}

func idsOf(v ...int) []wire.Int {
	out := make([]wire.Int, len(v))
	for i, x := range v {
		out[i] = wire.Int(x)
	}
	return out
}

// wantHashes hashes ids from scratch, the reference every cached answer
// must equal.
func wantHashes(t *testing.T, st *state, ids []wire.Int) [][]byte {
	t.Helper()
	u := make([]int64, len(ids))
	for i, x := range ids {
		u[i] = int64(x)
	}
	h, err := st.s.hasher.ChunkHashes(u)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func hashesOf(t *testing.T, st *state, req string, ids []wire.Int) [][]byte {
	t.Helper()
	return saltedHashesOf(t, st, req, "", ids)
}

func saltedHashesOf(t *testing.T, st *state, req, salt string, ids []wire.Int) [][]byte {
	t.Helper()
	k := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: ids, End: wire.Int(len(ids)), RequestID: req, CacheSalt: salt}
	got, err := st.chunkHashes(k, len(ids)/4)
	if err != nil {
		t.Fatal(err)
	}
	if want := wantHashes(t, st, ids); len(got) != len(want) {
		t.Fatalf("%s: %d hashes, want %d", req, len(got), len(want))
	} else {
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("%s: chunk %d hash %x, want %x", req, i, got[i], want[i])
			}
		}
	}
	return got
}

// sameArray reports whether a and b are the same stored hash (reused, not
// recomputed).
func sameArray(a, b []byte) bool { return &a[0] == &b[0] }

// TestPrefixCacheSharedPrompt: a second request with the same prompt gets
// the first request's stored hashes (no hashing), and a prompt that shares
// only a prefix reuses exactly that prefix.
func TestPrefixCacheSharedPrompt(t *testing.T) {
	st := prefixState(t, 64)
	p := idsOf(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
	first := hashesOf(t, st, "a", p)
	if n := st.prefixes.len(); n != 3 {
		t.Fatalf("cache holds %d chunks after the first prompt, want 3", n)
	}
	second := hashesOf(t, st, "b", p)
	for i := range first {
		if !sameArray(first[i], second[i]) {
			t.Fatalf("chunk %d was hashed again for another request of the same prompt", i)
		}
	}
	// Same first chunk, different second: chunk 0 reused, 1 and 2 new.
	q := idsOf(1, 2, 3, 4, 5, 6, 7, 99, 9, 10, 11, 12)
	third := hashesOf(t, st, "c", q)
	if !sameArray(first[0], third[0]) || sameArray(first[1], third[1]) || bytes.Equal(first[2], third[2]) {
		t.Fatalf("prefix reuse wrong: chunk0 shared=%v chunk1 shared=%v chunk2 equal=%v",
			sameArray(first[0], third[0]), sameArray(first[1], third[1]), bytes.Equal(first[2], third[2]))
	}
	if n := st.prefixes.len(); n != 5 {
		t.Fatalf("cache holds %d chunks, want 5", n)
	}
}

// TestPrefixCacheNeedsSameParent: the same chunk tokens behind another
// prefix are a different chunk (another hash), never a reuse.
func TestPrefixCacheNeedsSameParent(t *testing.T) {
	st := prefixState(t, 64)
	a := hashesOf(t, st, "a", idsOf(1, 2, 3, 4, 5, 6, 7, 8))
	b := hashesOf(t, st, "b", idsOf(9, 9, 9, 9, 5, 6, 7, 8))
	if bytes.Equal(a[1], b[1]) {
		t.Fatalf("chunk 1 behind different prefixes has one hash %x", a[1])
	}
}

// TestPrefixCacheFingerprintCollision: an entry found under the request's
// key but holding other token ids (what a fingerprint collision looks
// like) is not used; the chunk is hashed.
func TestPrefixCacheFingerprintCollision(t *testing.T) {
	st := prefixState(t, 64)
	p := idsOf(1, 2, 3, 4, 5, 6, 7, 8)
	first := hashesOf(t, st, "a", p)
	// Corrupt chunk 1's cached tokens in place, keeping its key.
	parent := &chunkNode{hash: first[0]}
	id := st.prefixes.idOf(parent, "", p[4:8])
	n := st.prefixes.cur[id]
	if n == nil {
		t.Fatal("chunk 1 not cached")
	}
	n.tokens = []uint32{5, 6, 7, 9}
	second := hashesOf(t, st, "b", p) // hashesOf checks every hash is right
	if !sameArray(first[0], second[0]) {
		t.Fatal("chunk 0 was not reused")
	}
	if sameArray(first[1], second[1]) {
		t.Fatal("chunk 1 was taken from an entry with other token ids")
	}
}

// TestPrefixCacheIsPerSalt: a prompt another cache_salt hashed is hashed
// again (so LOOKUP's speed tells a tenant nothing about other tenants'
// prompts); the same salt reuses its own entries.
func TestPrefixCacheIsPerSalt(t *testing.T) {
	st := prefixState(t, 64)
	p := idsOf(1, 2, 3, 4, 5, 6, 7, 8)
	a := saltedHashesOf(t, st, "a", "tenant-a", p)
	b := saltedHashesOf(t, st, "b", "tenant-b", p)
	for i := range a {
		if sameArray(a[i], b[i]) {
			t.Fatalf("chunk %d of salt tenant-a reused for salt tenant-b", i)
		}
	}
	again := saltedHashesOf(t, st, "c", "tenant-a", p)
	for i := range a {
		if !sameArray(a[i], again[i]) {
			t.Fatalf("chunk %d not reused for the same salt", i)
		}
	}
	if n := st.prefixes.len(); n != 4 {
		t.Fatalf("cache holds %d chunks, want 2 per salt", n)
	}
}

// TestPrefixCacheBounded: the cache never holds more chunks than its
// bound, and a negative bound keeps none.
func TestPrefixCacheBounded(t *testing.T) {
	st := prefixState(t, 8)
	for i := range 20 {
		hashesOf(t, st, fmt.Sprint("r", i), idsOf(i, i, i, i, 1, 2, 3, 4, 5, 6, 7, 8))
		if n := st.prefixes.len(); n > 8 {
			t.Fatalf("after prompt %d the cache holds %d chunks, bound 8", i, n)
		}
	}
	if n := st.prefixes.len(); n < 4 {
		t.Fatalf("cache holds %d chunks, want at least a generation (4)", n)
	}
	off := prefixState(t, -1)
	p := idsOf(1, 2, 3, 4, 5, 6, 7, 8)
	first := hashesOf(t, off, "a", p)
	second := hashesOf(t, off, "b", p)
	if n := off.prefixes.len(); n != 0 || sameArray(first[0], second[0]) {
		t.Fatalf("disabled cache: %d chunks held, reused=%v", n, sameArray(first[0], second[0]))
	}
}
