package l1

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestClearedReservationExpiryCounted: a reservation removed by Clear whose
// writer never commits or aborts is reclaimed by the sweep once its write
// lease runs out, and counted in ExpiredWrites
// (lmcache_mp_l1_expired_leases_total{kind="write"}: an uncommitted
// reservation reclaimed) like an abandoned reservation that was not
// cleared. The sweep freed it without counting it.
func TestClearedReservationExpiryCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newTable(16*kib, "")
		if _, err := tb.Reserve("gone", keyRange(0, 1), sizes(1, 4*kib)); err != nil {
			t.Fatal(err)
		}
		if _, err := tb.Reserve("also-gone", keyRange(1, 2), sizes(1, 4*kib)); err != nil {
			t.Fatal(err)
		}
		tb.Clear() // both reservations are cleared; one more is staged after it
		if _, err := tb.Reserve("also-gone", keyRange(5, 6), sizes(1, 4*kib)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(601 * time.Second) // past the 600 s write lease
		tb.Sweep()
		st := tb.Stats()
		if st.UsedBytes != 0 || st.StagingObjects != 0 {
			t.Fatalf("after the sweep: %+v, want every abandoned reservation reclaimed", st)
		}
		if st.ExpiredWrites != 3 {
			t.Fatalf("expired writes = %d, want 3 (two cleared reservations, one staged)", st.ExpiredWrites)
		}
	})
}
