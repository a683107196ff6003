package ledger

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// refEntry is the reference model's view of one key.
type refEntry struct {
	salt  string
	size  int64
	stamp int // last store or touch, for the LRU order
}

// TestIncrementalGrowthMatchesMap drives random store, lookup (touch) and
// delete batches across six index doublings and checks the ledger against
// a plain map: at checkpoints taken while a migration is in progress every
// live key must be findable (in exactly one table) and deleted keys not,
// and keys, bytes, per-salt usage and each salt's LRU order must match.
func TestIncrementalGrowthMatchesMap(t *testing.T) {
	const space = 60_000
	salts := []string{"a", "b", "c", "d", "e"}
	l := New()
	ref := map[int]*refEntry{}
	r := rand.New(rand.NewPCG(7, 11))
	keyOf := func(i int) Key { return key(t, fmt.Sprintf("%08x", i), "m", salts[i%len(salts)]) }
	stamp, growths, midChecks := 0, 0, 0
	for op := 0; op < 400_000; {
		n := 1 + r.IntN(64)
		batch := make([]Event, 0, n)
		for range n {
			i := r.IntN(space)
			stamp++
			switch p := r.IntN(10); {
			case p < 6:
				sz := int64(1 + r.IntN(1000))
				batch = append(batch, Event{Op: OpStore, Key: keyOf(i), Bytes: sz})
				ref[i] = &refEntry{salt: salts[i%len(salts)], size: sz, stamp: stamp}
			case p < 8:
				batch = append(batch, Event{Op: OpLookup, Key: keyOf(i)})
				if e, ok := ref[i]; ok {
					e.stamp = stamp
				}
			default:
				batch = append(batch, Event{Op: OpDelete, Key: keyOf(i)})
				delete(ref, i)
			}
		}
		size := len(l.index)
		l.Apply(batch)
		if len(l.index) != size {
			growths++
		}
		op += n
		if l.old != nil && op/512 != (op-n)/512 {
			midChecks++
			checkLedger(t, l, ref, keyOf, space)
		}
	}
	checkLedger(t, l, ref, keyOf, space)
	if growths < 6 || midChecks < 6 {
		t.Fatalf("exercised %d growths and %d mid-migration checks, want at least 6 of each", growths, midChecks)
	}
	// The LRU order per salt, as an eviction plan of everything shows it.
	zero := int64(0)
	got := planBySalt(l, l.ComputePlan(quota.Limits{Default: &zero}, PlanOptions{Ratio: 1, Watermark: 1}))
	for _, salt := range salts {
		var want []int
		for i, e := range ref {
			if e.salt == salt {
				want = append(want, i)
			}
		}
		slices.SortFunc(want, func(a, b int) int { return ref[a].stamp - ref[b].stamp })
		ks := got[salt]
		if len(ks) != len(want) {
			t.Fatalf("salt %s: plan has %d keys, want %d", salt, len(ks), len(want))
		}
		for j, i := range want {
			if h := ks[j].HashHex(); h != fmt.Sprintf("%08x", i) {
				t.Fatalf("salt %s: LRU position %d is %s, want %08x", salt, j, h, i)
			}
		}
	}
}

// checkLedger compares l with ref: counts, bytes, per-salt usage, and the
// presence of every key of the space in exactly the right table.
func checkLedger(t *testing.T, l *Ledger, ref map[int]*refEntry, keyOf func(int) Key, space int) {
	t.Helper()
	var total int64
	bySalt := map[string]int64{}
	for _, e := range ref {
		total += e.size
		bySalt[e.salt] += e.size
	}
	st := l.Stats()
	if st.Keys != len(ref) || st.Bytes != total {
		t.Fatalf("ledger has %d keys %d bytes, want %d keys %d bytes", st.Keys, st.Bytes, len(ref), total)
	}
	usage, sum := l.Usage()
	if sum != total || len(usage) != len(bySalt) {
		t.Fatalf("usage %v total %d, want %v total %d", usage, sum, bySalt, total)
	}
	for s, b := range bySalt {
		if usage[s] != b {
			t.Fatalf("salt %s usage %d, want %d", s, usage[s], b)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	slots := 0
	for _, tab := range [][]uint64{l.index, l.old} {
		for _, v := range tab {
			if v != 0 {
				slots++
			}
		}
	}
	if slots != len(ref) {
		t.Fatalf("index tables hold %d slots, want %d", slots, len(ref))
	}
	for i := 0; i < space; i++ {
		k := keyOf(i)
		want, live := ref[i]
		c, ok := l.lookupKey(&k)
		if !ok {
			t.Fatalf("key %d: names not interned", i)
		}
		_, _, idx, _, found := l.findH(&c, l.hashOf(&c))
		if found != live {
			t.Fatalf("key %d: found=%v, want %v (migrating=%v)", i, found, live, l.old != nil)
		}
		if live && l.at(idx).size != want.size {
			t.Fatalf("key %d: size %d, want %d", i, l.at(idx).size, want.size)
		}
	}
}

// TestGrowthWorkPerCallBounded counts the old-index slots each call
// migrates: at most migrateStep per store or delete, never a whole table,
// every migration finishes before the next doubling starts, and the table
// each doubling switches to was allocated and prefaulted whole before.
func TestGrowthWorkPerCallBounded(t *testing.T) {
	l := New()
	maxPerEvent, growths := uint64(0), 0
	var doublingWork uint64 // what one-shot doublings would have moved at once
	apply := func(evs []Event) {
		size, pending, before := len(l.index), l.old != nil, l.migrated
		ready := l.next != nil && l.nextFaulted == len(l.next) && len(l.next) == 2*size
		l.Apply(evs)
		moved := l.migrated - before
		if moved > uint64(migrateStep*len(evs)) {
			t.Fatalf("a %d-event call migrated %d slots, bound %d", len(evs), moved, migrateStep*len(evs))
		}
		if len(evs) == 1 {
			maxPerEvent = max(maxPerEvent, moved)
		}
		if len(l.index) != size {
			growths++
			doublingWork = uint64(size)
			if pending {
				t.Fatalf("index grew to %d slots while the previous migration was unfinished", len(l.index))
			}
			if !ready {
				t.Fatalf("index grew to %d slots before the next table was allocated and prefaulted", len(l.index))
			}
		}
	}
	for i := 0; i < 300_000; i++ {
		apply([]Event{{Op: OpStore, Key: key(t, fmt.Sprintf("%08x", i), "m", "s"), Bytes: 1}})
	}
	for i := 300_000; i < 400_000; i += 100 {
		batch := make([]Event, 0, 100)
		for j := i; j < i+100; j++ {
			batch = append(batch, Event{Op: OpStore, Key: key(t, fmt.Sprintf("%08x", j), "m", "s"), Bytes: 1})
		}
		apply(batch)
	}
	// Deletes migrate too, and a shrinking ledger never grows.
	for i := 0; i < 400_000; i += 7 {
		apply([]Event{{Op: OpDelete, Key: key(t, fmt.Sprintf("%08x", i), "m", "s")}})
	}
	if maxPerEvent != migrateStep {
		t.Fatalf("max slots migrated by one event %d, want %d", maxPerEvent, migrateStep)
	}
	// 1024 slots doubled to 1<<20 (holds 786,432 keys at 3/4): ten doublings.
	if growths != 10 || len(l.index) != 1<<20 || doublingWork != 1<<19 {
		t.Fatalf("%d growths to %d slots (last old table %d slots), want 10 to %d (%d)", growths, len(l.index), doublingWork, 1<<20, 1<<19)
	}
	if want := 400_000 - (400_000+6)/7; l.Stats().Keys != want {
		t.Fatalf("%d keys, want %d", l.Stats().Keys, want)
	}
	// The big tables are mapped from the kernel. The last migration (of
	// 1<<19 slots) has had 63,926 of the 65,536 calls it needs (6,783 stores after the one that started it, 57,143 deletes), so the old
	// table is mid-way, its migrated chunks handed back to the kernel:
	// every key is still found and no deleted one is.
	if l.indexSlab == nil || l.old == nil || l.oldSlab == nil || l.migDone != 63_926*migrateStep {
		t.Fatalf("index slab %v, old slab %v, %d old slots migrated", l.indexSlab != nil, l.oldSlab != nil, l.migDone)
	}
	for i := 0; i < 400_000; i++ {
		k := key(t, fmt.Sprintf("%08x", i), "m", "s")
		c, _ := l.lookupKey(&k)
		if _, _, _, _, ok := l.findH(&c, l.hashOf(&c)); ok != (i%7 != 0) {
			t.Fatalf("key %d found=%v", i, ok)
		}
	}
}

// TestFreedEntriesReused: deleted entries are reused through the free list
// threaded through them, so churn does not grow the entry pages.
func TestFreedEntriesReused(t *testing.T) {
	l := New()
	for round := 0; round < 5; round++ {
		for i := 0; i < 1000; i++ {
			l.Apply([]Event{{Op: OpStore, Key: key(t, fmt.Sprintf("%04x", round*1000+i), "m", "s"), Bytes: 1}})
		}
		for i := 0; i < 1000; i++ {
			l.Apply([]Event{{Op: OpDelete, Key: key(t, fmt.Sprintf("%04x", round*1000+i), "m", "s")}})
		}
	}
	if l.n != 1000 || l.Stats().Keys != 0 {
		t.Fatalf("%d entries allocated, %d live after 5 rounds of 1,000 stores and deletes; want 1000, 0", l.n, l.Stats().Keys)
	}
}
