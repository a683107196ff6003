package l1

import (
	"math"
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestReleaseHugeCount: a release count past an int32 (a client's reader
// count reaches Release unchecked from some paths) releases every lock the
// owner holds, as any count at least that large does, for an owner and
// for anonymous locks. Converted to int32 it wrapped: 2^31 became
// negative and released nothing, 2^32+1 became 1.
func TestReleaseHugeCount(t *testing.T) {
	for _, tc := range []struct {
		owner string
		n     int
	}{{"r", math.MaxInt32 + 1}, {"r", 1<<32 + 1}, {"", math.MaxInt32 + 1}, {"", 1<<32 + 1}} {
		tb := newTable(64*kib, "")
		k := keyRange(0, 1)
		if _, err := tb.Reserve("w", k, sizes(1, kib)); err != nil {
			t.Fatal(err)
		}
		if res := tb.Commit("w", k, CommitOpts{}); res.Committed != 1 {
			t.Fatalf("commit: %+v", res)
		}
		tb.ReadLock(tc.owner, k, 3)
		tb.ReadLock(tc.owner, k, 2)
		if released, _ := tb.Release(tc.owner, k, tc.n); released != 5 {
			t.Fatalf("owner %q: Release(n=%d) released %d locks, want all 5", tc.owner, tc.n, released)
		}
		if leaks := tb.Leaks(); len(leaks) != 0 {
			t.Fatalf("owner %q, n=%d: locks left %v", tc.owner, tc.n, leaks)
		}
		if !slices.Equal(tb.Contains([]objkey.Key{k[0]}), []bool{true}) {
			t.Fatalf("owner %q: the committed object is gone", tc.owner)
		}
	}
}
