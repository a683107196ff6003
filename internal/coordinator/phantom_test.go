package coordinator_test

import (
	"context"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestEvictionDropsPhantomKeys: a key over quota whose delete event never
// comes back (gone from L2, the event lost) is sent three times and then
// dropped from the ledger, counted in
// lmcache_coordinator_eviction_phantom_keys_dropped_total, instead of being
// re-sent every cycle with its bytes holding its salt over the watermark.
// A dispatch the server refuses does not count toward the three.
func TestEvictionDropsPhantomKeys(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.InflightTTL = 0 })
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.events(rev("store", "0a", "a", mib), rev("store", "0b", "a", mib))
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 0}, 200)

	mp.mu.Lock()
	mp.deleteCode = 503
	mp.mu.Unlock()
	c.cycle() // refused: not a dispatch that counts
	mp.mu.Lock()
	mp.deleteCode = 200
	mp.mu.Unlock()
	for i := 0; i < 3; i++ {
		c.cycle()
		if i == 0 {
			// 0b's delete event comes back; 0a's never does.
			c.events(rev("delete", "0b", "a", 0))
		}
	}
	if n := len(mp.deleteBatches()); n != 4 {
		t.Fatalf("%d DELETE requests before the drop, want 4", n)
	}
	r := c.srv.RunEvictionCycle(context.Background())
	c.srv.WaitDispatches()
	if u := c.usageBytes("a"); u != 0 {
		t.Fatalf("usage of a after the drop %d, want 0", u)
	}
	if r.Victims != 0 {
		t.Fatalf("fourth counted cycle %+v, want no victims", r)
	}
	if v := c.metric("lmcache_coordinator_eviction_phantom_keys_dropped_total"); v != 1 {
		t.Fatalf("phantom_keys_dropped_total %v, want 1", v)
	}
	c.cycle()
	batches := mp.deleteBatches()
	if len(batches) != 4 {
		t.Fatalf("dropped key sent again: %d requests", len(batches))
	}
	for _, b := range batches[1:] {
		if got := strings.Join(hexes(b), ","); !strings.HasPrefix(got, "a/0a") {
			t.Fatalf("batch %s", got)
		}
	}
}
