package ledger

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// TestAddListedKeepsKnownKeys: StoreListed with keepKnown, merging a
// listing into a restored ledger, adds the keys it lacks at the MRU end
// with their listed sizes, leaves the keys it holds at their sizes and LRU
// positions, and refuses a key deleted since the listing began.
func TestAddListedKeepsKnownKeys(t *testing.T) {
	l := New()
	l.Apply([]Event{{Op: OpStore, Key: key(t, "01", "m", "s"), Bytes: 10}, {Op: OpStore, Key: key(t, "02", "m", "s"), Bytes: 10}})
	l.BeginListing()
	l.Apply([]Event{{Op: OpDelete, Key: key(t, "03", "m", "s")}})
	for _, tc := range []struct {
		hash              string
		added, superseded bool
	}{{"02", false, false}, {"04", true, false}, {"01", false, false}, {"03", false, true}} {
		added, superseded := l.StoreListed(key(t, tc.hash, "m", "s"), 7, true)
		if added != tc.added || superseded != tc.superseded {
			t.Fatalf("%s: added %v superseded %v, want %v %v", tc.hash, added, superseded, tc.added, tc.superseded)
		}
	}
	l.EndListing()
	if u := l.SaltUsage("s"); u != 27 {
		t.Fatalf("usage %d, want 27", u)
	}
	zero := int64(0)
	keys, _ := l.Materialize(l.ComputePlan(quota.Limits{Default: &zero}, PlanOptions{Ratio: 1, Watermark: 1}).Flat())
	got := ""
	for _, k := range keys {
		got += k.HashHex() + ","
	}
	if got != "01,02,04," {
		t.Fatalf("LRU order %s, want 01,02,04,", got)
	}
}
