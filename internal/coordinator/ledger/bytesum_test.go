package ledger

import (
	"math"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// TestSaltUsageDoesNotWrap: sizes are any int64 >= 0 (the handlers check
// only the sign), so a salt's byte sum can pass math.MaxInt64. It must not
// wrap negative: a negative usage hid the salt from GET /quota's usage and
// from every eviction plan (a plan skips salts with no bytes), so one
// absurd size_bytes exempted a salt from its quota. Deleting the keys
// brings the sums back exactly.
func TestSaltUsageDoesNotWrap(t *testing.T) {
	l := New()
	a, b, c := key(t, "0a", "m", "s"), key(t, "0b", "m", "s"), key(t, "0c", "m", "s")
	l.Apply([]Event{
		{Op: OpStore, Key: a, Bytes: math.MaxInt64},
		{Op: OpStore, Key: b, Bytes: math.MaxInt64},
		{Op: OpStore, Key: c, Bytes: 5},
	})
	if u := l.SaltUsage("s"); u != math.MaxInt64 {
		t.Fatalf("usage of 2*MaxInt64+5 bytes reads %d, want it saturated at %d", u, int64(math.MaxInt64))
	}
	if m, total := l.Usage(); m["s"] != math.MaxInt64 || total != math.MaxInt64 || l.Stats().Bytes != math.MaxInt64 {
		t.Fatalf("Usage %v total %d, Stats.Bytes %d, want all saturated", m, total, l.Stats().Bytes)
	}
	lim := quota.Limits{Explicit: map[string]int64{"s": 100}}
	if p := l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1}); p.Len() != 3 {
		t.Fatalf("plan over a salt far over its limit has %d victims, want 3", p.Len())
	}
	l.Apply([]Event{{Op: OpDelete, Key: a}})
	if u := l.SaltUsage("s"); u != math.MaxInt64 {
		t.Fatalf("after one delete usage %d, want %d (MaxInt64+5, saturated)", u, int64(math.MaxInt64))
	}
	l.Apply([]Event{{Op: OpStore, Key: b, Bytes: 7}})
	if u, st := l.SaltUsage("s"), l.Stats(); u != 12 || st.Bytes != 12 {
		t.Fatalf("after resizing b usage %d, total %d, want 12 exactly", u, st.Bytes)
	}
	l.Apply([]Event{{Op: OpDelete, Key: b}, {Op: OpDelete, Key: c}})
	if u, st := l.SaltUsage("s"), l.Stats(); u != 0 || st.Bytes != 0 || st.Keys != 0 {
		t.Fatalf("empty ledger reads usage %d, total %d, %d keys", u, st.Bytes, st.Keys)
	}
}
