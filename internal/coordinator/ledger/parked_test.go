package ledger

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// parkedLedger holds keys 00..19 of salt "s", stored in that order (00
// least recent), 00..09 pinned, and one plan of five victims run over it,
// which parks the ten pinned keys it steps over.
func parkedLedger(t *testing.T) (*Ledger, []objkey.Key) {
	t.Helper()
	l := New()
	var all []objkey.Key
	for i := range 20 {
		k := key(t, fmt.Sprintf("%02x", i), "m", "s")
		l.Apply([]Event{{Op: OpStore, Key: k, Bytes: 10}})
		all = append(all, k.ObjectKey())
	}
	l.Pin(all[:10], 1)
	p := l.ComputePlan(overOne, PlanOptions{Ratio: 0.25, Watermark: 1})
	if got := hexes(planKeys(l, p)); !slices.Equal(got, []string{"0a", "0b", "0c", "0d", "0e"}) || p.Walked != 15 {
		t.Fatalf("first plan: victims %v after walking %d entries, want 0a..0e after 15", got, p.Walked)
	}
	return l, all
}

var zeroLimit = int64(0)

// everything makes every salt over its limit, and the plan takes all of a
// salt's keys (limit 0); overOne takes Ratio of salt "s".
var (
	everything = quota.Limits{Default: &zeroLimit}
	overOne    = quota.Limits{Explicit: map[string]int64{"s": 1}}
)

func hexes(keys []objkey.Key) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.HashHex()
	}
	return out
}

// lruOrder is every key of the ledger, least recent first, as a plan of
// all of them (nothing pinned left) sees it.
func lruOrder(t *testing.T, l *Ledger) []string {
	t.Helper()
	return hexes(planKeys(l, l.ComputePlan(everything, PlanOptions{Ratio: 1, Watermark: 1})))
}

// TestPlanSkipsParkedPins: a plan walks the pinned keys at a salt's LRU
// head once; the next plan starts at the first unpinned key. Before, every
// cycle walked all of them under the ledger lock (BENCHMARKS.md §3a: 24.5
// ms a plan at 100,000 pinned keys).
func TestPlanSkipsParkedPins(t *testing.T) {
	l, _ := parkedLedger(t)
	p := l.ComputePlan(overOne, PlanOptions{Ratio: 0.25, Watermark: 1})
	if got := hexes(planKeys(l, p)); !slices.Equal(got, []string{"0a", "0b", "0c", "0d", "0e"}) || p.Walked != 5 {
		t.Fatalf("second plan: victims %v after walking %d entries, want 0a..0e after 5", got, p.Walked)
	}
	if st := l.Stats(); st.Keys != 20 || st.PinnedKeys != 10 || l.SaltUsage("s") != 200 {
		t.Fatalf("stats %+v usage %d, want 20 keys, 10 pinned, 200 bytes", st, l.SaltUsage("s"))
	}
}

// TestUnpinnedKeysKeepTheirLRUPlace: unpinned, parked keys are the least
// recent again, in their own order; a lookup or store of a parked key
// makes it the most recent, as for any key; a deleted parked key is gone.
func TestUnpinnedKeysKeepTheirLRUPlace(t *testing.T) {
	l, all := parkedLedger(t)
	l.Apply([]Event{
		{Op: OpLookup, Key: FromObjectKey(all[2])},
		{Op: OpStore, Key: FromObjectKey(all[4]), Bytes: 10},
		{Op: OpDelete, Key: FromObjectKey(all[6])},
	})
	l.Pin(all[:10], -1)
	want := []string{"00", "01", "03", "05", "07", "08", "09", "0a", "0b", "0c", "0d", "0e", "0f", "10", "11", "12", "13", "02", "04"}
	if got := lruOrder(t, l); !slices.Equal(got, want) {
		t.Fatalf("LRU order after unpin\n got %v\nwant %v", got, want)
	}
	if st := l.Stats(); st.Keys != 19 || st.PinnedKeys != 0 || l.SaltUsage("s") != 190 {
		t.Fatalf("stats %+v usage %d, want 19 keys, none pinned, 190 bytes", st, l.SaltUsage("s"))
	}
}

// TestUnmarkKeepsParkedKey: a victim pinned after its dispatch is parked by
// the next plan; the dispatch failing (Unmark) leaves it parked, so its
// unpin still finds it and it is evicted again. Had Unmark cleared the
// mark, the key would sit in the parked list with no pin, never planned.
func TestUnmarkKeepsParkedKey(t *testing.T) {
	l := New()
	k := key(t, "01", "m", "s")
	l.Apply([]Event{{Op: OpStore, Key: k, Bytes: 10}})
	t0 := time.Now()
	opts := PlanOptions{Ratio: 1, Watermark: 1, InflightTTL: time.Minute, Mark: true, MaxDispatches: 3, Now: t0}
	first := l.ComputePlan(everything, opts)
	l.Pin([]objkey.Key{k.ObjectKey()}, 1)
	if p := l.ComputePlan(everything, opts); p.Len() != 0 || p.Walked != 1 {
		t.Fatalf("pinned: %d victims after walking %d, want 0 after 1", p.Len(), p.Walked)
	}
	l.Unmark(first.Flat())
	l.Pin([]objkey.Key{k.ObjectKey()}, -1)
	if got := lruOrder(t, l); !slices.Equal(got, []string{"01"}) {
		t.Fatalf("after unmark and unpin: %v, want [01]", got)
	}
}

// TestReplacePinsUnparks: ReplacePins (undoing a pin change) puts every
// parked key back in LRU order, and those it pins again are parked again.
func TestReplacePinsUnparks(t *testing.T) {
	l, all := parkedLedger(t)
	l.ReplacePins([]PinCount{{Key: all[1], Count: 1}})
	want := []string{"00", "02", "03", "04", "05", "06", "07", "08", "09", "0a", "0b", "0c", "0d", "0e", "0f", "10", "11", "12", "13"}
	if got := lruOrder(t, l); !slices.Equal(got, want) {
		t.Fatalf("LRU order after ReplacePins\n got %v\nwant %v", got, want)
	}
}

// TestCheckpointWritesParkedKeysFirst: a checkpoint of a ledger with
// parked keys restores the same LRU order.
func TestCheckpointWritesParkedKeysFirst(t *testing.T) {
	l, _ := parkedLedger(t)
	r := New()
	d := checkpoint.NewDecoder(section(l))
	if n := r.LoadCheckpoint(d); n != 20 || d.Err() != nil {
		t.Fatalf("restored %d keys, err %v", n, d.Err())
	}
	var want []string
	for i := range 20 {
		want = append(want, fmt.Sprintf("%02x", i))
	}
	if got := lruOrder(t, r); !slices.Equal(got, want) {
		t.Fatalf("restored LRU order\n got %v\nwant %v", got, want)
	}
}

// TestRestoreParksLeadingPins: a restart restores pins before the
// checkpoint, and the pinned keys at a salt's least recent end are parked
// as they load, so the first plan after a restart walks only its victims;
// it walked every pinned key first (15 entries for 5 victims here). A
// pinned key behind an unpinned one keeps its LRU place: unpinned, it is
// not the least recent.
func TestRestoreParksLeadingPins(t *testing.T) {
	l, all := parkedLedger(t)
	l.Pin(all[15:16], 1) // behind unpinned keys: not parked at load
	r := New()
	r.RestorePins(l.Pins())
	d := checkpoint.NewDecoder(section(l))
	if n := r.LoadCheckpoint(d); n != 20 || d.Err() != nil {
		t.Fatalf("restored %d keys, err %v", n, d.Err())
	}
	p := r.ComputePlan(overOne, PlanOptions{Ratio: 0.25, Watermark: 1})
	if got := hexes(planKeys(r, p)); !slices.Equal(got, []string{"0a", "0b", "0c", "0d", "0e"}) || p.Walked != 5 {
		t.Fatalf("first plan after restore: victims %v after walking %d entries, want 0a..0e after 5", got, p.Walked)
	}
	r.Pin(all[:16], -1)
	var want []string
	for i := range 20 {
		want = append(want, fmt.Sprintf("%02x", i))
	}
	if got := lruOrder(t, r); !slices.Equal(got, want) {
		t.Fatalf("LRU order after unpinning all\n got %v\nwant %v", got, want)
	}
}
