package l1

import (
	"math"
	"testing"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestReaderCountSaturates: read locks on one object stop counting at
// 2^31-1 instead of wrapping. Every lock renews the lease, so a client
// repeating a LOOKUP of 128 readers (num_kv_readers) keeps adding to the
// count; past 2^31-1 it went negative: the owner's release released
// nothing and the object could never be evicted or deleted until the
// lease ran out. The count is set near the limit directly rather than by
// 2^24 lookups.
func TestReaderCountSaturates(t *testing.T) {
	tb := newTable(64*kib, eviction.LRUName)
	k := []objkey.Key{key(1)}
	store(t, tb, k)
	tb.ReadLock("r", k, 1)
	o := tb.resident[k[0]]
	o.readers, o.holders[0].n = math.MaxInt32-1, math.MaxInt32-1
	tb.ReadLock("r", k, MaxReaders)
	tb.ReadLock("other", k, MaxReaders)
	if o.readers != math.MaxInt32 || o.held() != math.MaxInt32 {
		t.Fatalf("readers %d (held %d), want saturated at %d", o.readers, o.held(), int32(math.MaxInt32))
	}
	if n, _ := tb.Release("r", k, math.MaxInt); n != math.MaxInt32 {
		t.Fatalf("owner released %d locks, want %d", n, int32(math.MaxInt32))
	}
	if del, skipped := tb.Delete(k, false); len(del) != 1 || skipped != 0 {
		t.Fatalf("delete after the last release: deleted %v, skipped %d", del, skipped)
	}
}
