package mq_test

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestFreeLookupLocksHugeReaderCount: a FREE_LOOKUP_LOCKS whose reader
// count (num_kv_readers, or an older client's tp_size frame) does not fit
// an int32 releases the request's lock, the count clamped as LOOKUP's is,
// instead of wrapping to a negative count that leaves the lock held and
// the holder's count corrupt, so that even a later well-formed free
// cannot release it.
func TestFreeLookupLocksHugeReaderCount(t *testing.T) {
	for _, c := range []struct {
		name            string
		readers, tpSize int64
	}{
		{"num_kv_readers", 1 << 31, 1},
		{"legacy tp_size", 0, 1 << 31},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _, sched, tokens := stored(t, 31, 2)
			k := key("m", 1, -1, tokens, 0, 2*testChunk, "r")
			k.NumKVReaders = wire.Int(c.readers)
			lookupUntil(t, sched, k, 2)
			if got := h.eng.Leaks(); len(got) != 2 {
				t.Fatalf("%d chunks referenced after LOOKUP, want 2: %v", len(got), got)
			}
			if err := sched.FreeLookupLocks(k, int(c.tpSize)); err != nil {
				t.Fatal(err)
			}
			if got := h.eng.Leaks(); len(got) != 0 {
				// Free again the well-formed way, so the failure shows
				// the state the huge count left, not just the lock.
				freeLocks(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "r"))
				t.Fatalf("references left after FREE_LOOKUP_LOCKS (num_kv_readers %d, tp_size %d): %v (after a second free with 1: %v)", c.readers, c.tpSize, got, h.eng.Leaks())
			}
		})
	}
}
