package ledger

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// yieldingLedger holds n keys of salt "s" (00.. in store order) and plans
// with the lock given up at every check, calling during without it.
func yieldingLedger(t *testing.T, n int, during func(l *Ledger)) *Ledger {
	t.Helper()
	l := New()
	for i := range n {
		l.Apply([]Event{{Op: OpStore, Key: key(t, fmt.Sprintf("%04x", i), "m", "s"), Bytes: 1}})
	}
	l.holdFor = time.Nanosecond // yield at every check
	l.afterYield = func() {
		if !l.mu.TryLock() {
			t.Fatal("plan called afterYield holding the ledger lock")
		}
		l.mu.Unlock()
		if during != nil {
			during(l)
		}
	}
	return l
}

// onlyS plans every key of salt "s" (limit 0) and no other salt.
var onlyS = quota.Limits{Explicit: map[string]int64{"s": 0}}

func hexRange(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%04x", i))
	}
	return out
}

// TestPlanYieldsLockToIngest: a plan gives the ledger lock up while it
// walks (here at every check, in production after planHold), so ingest
// runs in between: a store applied during the plan lands, and the plan
// still takes every key once, in LRU order. Before, the whole walk held
// the lock (36 ms for BenchmarkEvictionPlan's 2,000,000 victims).
func TestPlanYieldsLockToIngest(t *testing.T) {
	n := 4 * planCheckEvery
	yields := 0
	l := yieldingLedger(t, n, func(l *Ledger) {
		yields++
		l.Apply([]Event{{Op: OpStore, Key: key(t, fmt.Sprintf("f%03x", yields), "m", "other"), Bytes: 1}})
	})
	p := l.ComputePlan(onlyS, PlanOptions{Ratio: 1, Watermark: 1})
	if yields != 4 {
		t.Fatalf("%d yields over %d entries, want 4", yields, n)
	}
	if got := hexes(planKeys(l, p)); !slices.Equal(got, hexRange(0, n)) || p.Walked != n {
		t.Fatalf("victims %v after walking %d, want 0000..%04x once each", got, p.Walked, n-1)
	}
	if st := l.Stats(); st.Keys != n+4 {
		t.Fatalf("%d keys, want the %d stored plus 4 stored during the plan", st.Keys, n)
	}
}

// TestPlanEndsLaneAtDeletedEntry: an entry the walk was about to visit,
// deleted while the plan let ingest in, ends its salt's share there (the
// next cycle plans the rest) instead of following a freed entry's links;
// a deleted entry further on is simply not met.
func TestPlanEndsLaneAtDeletedEntry(t *testing.T) {
	n := 4 * planCheckEvery
	first := true
	l := yieldingLedger(t, n, func(l *Ledger) {
		if first {
			first = false
			// The first check comes before the planCheckEvery-th step:
			// planCheckEvery-1 entries are taken, the next is the lane's.
			l.Apply([]Event{
				{Op: OpDelete, Key: key(t, fmt.Sprintf("%04x", 3*planCheckEvery), "m", "s")},
				{Op: OpDelete, Key: key(t, fmt.Sprintf("%04x", planCheckEvery-1), "m", "s")},
			})
		}
	})
	p := l.ComputePlan(onlyS, PlanOptions{Ratio: 1, Watermark: 1})
	if got := hexes(planKeys(l, p)); !slices.Equal(got, hexRange(0, planCheckEvery-1)) || p.Walked != planCheckEvery-1 {
		t.Fatalf("victims %v after walking %d, want 0000..%04x", got, p.Walked, planCheckEvery-2)
	}
	want := append(hexRange(planCheckEvery, 3*planCheckEvery), hexRange(3*planCheckEvery+1, n)...)
	next := hexes(planKeys(l, l.ComputePlan(onlyS, PlanOptions{Ratio: 1, Watermark: 1})))
	if !slices.Equal(next[planCheckEvery-1:], want) {
		t.Fatalf("next plan after the first's %d: %v, want %v", planCheckEvery-1, next[planCheckEvery-1:], want)
	}
}

// TestPlanKeepsItsSaltsDuringYield: a salt waiting for a free lane whose
// keys are all deleted while the plan let ingest in is not swept under the
// plan, so a new salt stored meanwhile cannot take over its id and have
// its keys planned under a salt it is not (here "new" has no limit and
// must not be touched).
func TestPlanKeepsItsSaltsDuringYield(t *testing.T) {
	l := New()
	lim := quota.Limits{Explicit: map[string]int64{}}
	// 16 salts fill the lanes; "late" waits for one.
	for i := range 16 {
		salt := fmt.Sprintf("busy-%02d", i)
		lim.Explicit[salt] = 0
		for j := range 2 * planCheckEvery {
			l.Apply([]Event{{Op: OpStore, Key: key(t, fmt.Sprintf("%02x%04x", i, j), "m", salt), Bytes: 1}})
		}
	}
	lim.Explicit["late"] = 0
	l.Apply([]Event{{Op: OpStore, Key: key(t, "aa", "m", "late"), Bytes: 1}})
	l.holdFor = time.Nanosecond // yield at every check
	first := true
	l.afterYield = func() {
		if first {
			first = false
			l.Apply([]Event{{Op: OpDelete, Key: key(t, "aa", "m", "late")}})
			l.Apply([]Event{{Op: OpStore, Key: key(t, "bb", "m", "new"), Bytes: 1}})
		}
	}
	p := l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1})
	by := planBySalt(l, p)
	if len(by["new"]) != 0 || len(by["late"]) != 0 || len(p.Salts) != 16 {
		t.Fatalf("plan salts %v (new: %v, late: %v), want the 16 busy ones only", p.Salts, by["new"], by["late"])
	}
	if l.SaltUsage("new") != 1 {
		t.Fatalf("salt new usage %d, want 1", l.SaltUsage("new"))
	}
}
