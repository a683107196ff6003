package l1

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestReleaseDrainsEveryCopy: an owner that locked a key, saw it cleared,
// and locked the key's new object again (a lookup repeated for the same
// request id) holds locks on two copies of the key. A release whose count
// covers them all drops them all. Release stopped at the first copy that
// the owner held: the cleared copy's locks, and its pool memory, stayed
// held until the read lease ran out (300 s by default).
func TestReleaseDrainsEveryCopy(t *testing.T) {
	for _, tc := range []struct {
		name         string
		clearAgain   bool // the second copy is cleared too: two detached copies, none resident
		wantResident int
	}{
		{name: "resident and detached", wantResident: 1},
		{name: "two detached", clearAgain: true, wantResident: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTable(64*kib, eviction.LRUName)
			k := []objkey.Key{key(1)}
			store(t, tb, k)
			tb.ReadLock("r", k, 2)
			tb.Clear()
			store(t, tb, k)
			tb.ReadLock("r", k, 3)
			if tc.clearAgain {
				tb.Clear()
			}
			if n, _ := tb.Release("r", k, 5); n != 5 {
				t.Fatalf("released %d locks, want all 5", n)
			}
			if leaks := tb.Leaks(); len(leaks) != 0 {
				t.Fatalf("locks left after the release: %v", leaks)
			}
			st := tb.Stats()
			if st.Detached != 0 || st.Objects != tc.wantResident || st.UsedBytes != int64(tc.wantResident)*4*kib {
				t.Fatalf("stats %+v, want no detached copy, %d resident object(s) and only their bytes used", st, tc.wantResident)
			}
		})
	}
}
