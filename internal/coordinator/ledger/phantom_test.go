package ledger

import (
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// TestPlanDropsPhantoms: a key dispatched MaxDispatches times with no
// delete event back is removed from the ledger (its bytes leave its salt)
// by the next plan that would send it again, instead of being sent
// forever; a store of the key in between restarts its count, a failed
// dispatch (Unmark) is taken back, and a key still in flight is withheld,
// not dropped.
func TestPlanDropsPhantoms(t *testing.T) {
	l := New()
	for _, h := range []string{"01", "02", "03"} {
		l.Apply([]Event{{Op: OpStore, Key: key(t, h, "m", "s"), Bytes: 10}})
	}
	zero := int64(0)
	lim := quota.Limits{Default: &zero}
	t0 := time.Now()
	plan := func(at time.Duration) *Plan {
		return l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1, InflightTTL: 10 * time.Second, Now: t0.Add(at), Mark: true, MaxDispatches: 3})
	}
	for i := 0; i < 3; i++ {
		p := plan(time.Duration(i) * 20 * time.Second)
		if p.Len() != 3 || p.Dropped != 0 {
			t.Fatalf("dispatch %d: %d victims, %d dropped", i+1, p.Len(), p.Dropped)
		}
		switch i {
		case 1:
			// 02's second dispatch failed: it does not count.
			_, live := l.Materialize(p.Flat())
			l.Unmark(live[1:2])
		case 2:
			// 03 is stored again after its third dispatch: L2 holds it.
			l.Apply([]Event{{Op: OpStore, Key: key(t, "03", "m", "s"), Bytes: 10}})
		}
	}
	// Still in flight after its third dispatch: withheld, not dropped.
	if p := plan(45 * time.Second); p.Dropped != 0 || p.InFlight != 3 {
		t.Fatalf("in flight: %d dropped, %d withheld", p.Dropped, p.InFlight)
	}
	p := plan(60 * time.Second)
	if p.Dropped != 1 || p.DroppedBytes != 10 || p.Len() != 2 {
		t.Fatalf("fourth plan: %d dropped (%d bytes), %d victims", p.Dropped, p.DroppedBytes, p.Len())
	}
	if u := l.SaltUsage("s"); u != 20 {
		t.Fatalf("usage after the drop %d, want 20", u)
	}
	if st := l.Stats(); st.Keys != 2 {
		t.Fatalf("ledger keys %d, want 2", st.Keys)
	}
	keys, _ := l.Materialize(p.Flat())
	if len(keys) != 2 || keys[0].HashHex() != "02" || keys[1].HashHex() != "03" {
		t.Fatalf("victims %v, want 02 and 03", keys)
	}
	// 02 had three counted dispatches after that plan and is dropped by
	// the next; 03, re-stored, is sent a second and third time first.
	if p := plan(80 * time.Second); p.Dropped != 1 || p.Len() != 1 {
		t.Fatalf("fifth plan: %d dropped, %d victims", p.Dropped, p.Len())
	}
	if p := plan(100 * time.Second); p.Dropped != 0 || p.Len() != 1 {
		t.Fatalf("sixth plan: %d dropped, %d victims", p.Dropped, p.Len())
	}
	if p := plan(120 * time.Second); p.Dropped != 1 || p.Len() != 0 || l.SaltUsage("s") != 0 {
		t.Fatalf("seventh plan: %d dropped, %d victims, usage %d", p.Dropped, p.Len(), l.SaltUsage("s"))
	}
}

// TestPlanCountsDispatchesWithoutMark: with the in-flight set off (every
// cycle re-sends, Mark false) dispatches are still counted, and
// MaxDispatches 0 never drops.
func TestPlanCountsDispatchesWithoutMark(t *testing.T) {
	zero := int64(0)
	lim := quota.Limits{Default: &zero}
	for _, max := range []int{0, 2} {
		l := New()
		l.Apply([]Event{{Op: OpStore, Key: key(t, "01", "m", "s"), Bytes: 10}})
		dropped := 0
		for i := 0; i < 4; i++ {
			p := l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1, MaxDispatches: max})
			dropped += p.Dropped
			if want := max == 0 || i < max; (p.Len() == 1) != want {
				t.Fatalf("max %d plan %d: %d victims", max, i+1, p.Len())
			}
		}
		if want := map[int]int{0: 0, 2: 1}[max]; dropped != want {
			t.Fatalf("max %d: %d dropped, want %d", max, dropped, want)
		}
	}
}
