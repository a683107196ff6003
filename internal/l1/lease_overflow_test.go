package l1

import (
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestLongLeasesDoNotWrap: lease TTLs as long as the flags accept
// (--l1-read-ttl-seconds and --l1-write-ttl-seconds up to 9.223e9 s, a
// time.Duration) keep their leases for good. now + TTL past 2^63 ns
// wrapped negative, so a write lease had run out before its commit and a
// read lock was gone as soon as it was taken.
func TestLongLeasesDoNotWrap(t *testing.T) {
	const ttl = 9e9 * time.Second // "never", and now + ttl > MaxInt64 ns
	tb, err := NewTable(TableConfig{Size: 64 * kib, Align: 4 * kib, ReadTTL: ttl, WriteTTL: ttl, Policy: eviction.LRUName})
	if err != nil {
		t.Fatal(err)
	}
	k := []objkey.Key{key(1)}
	if _, err := tb.Reserve("w", k, sizes(1, 4*kib)); err != nil {
		t.Fatal(err)
	}
	if res := tb.Commit("w", k, CommitOpts{}); res.Committed != 1 || res.Expired != 0 {
		t.Fatalf("commit: %+v, want committed 1, expired 0", res)
	}
	if s := tb.ReadLock("r", k, 1); s[0].Size == 0 {
		t.Fatal("resident key not locked")
	}
	if _, err := tb.Slots(k); err != nil {
		t.Fatalf("slots of a read-locked key: %v", err)
	}
	if ev, _ := tb.Evict([]Cut{{Global: true, Ratio: 1}}); len(ev) != 0 {
		t.Fatalf("read-locked key evicted: %v", ev)
	}
	if st := tb.Stats(); st.ReadLocked != 1 || st.ExpiredReads != 0 || st.ExpiredWrites != 0 {
		t.Fatalf("stats %+v, want one read lock and no expired lease", st)
	}
	if n, _ := tb.Release("r", k, 1); n != 1 {
		t.Fatalf("released %d, want 1", n)
	}
}
