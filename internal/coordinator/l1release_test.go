package coordinator_test

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestL1FactsReleasedOnDeregister: a server that deregisters (its process
// stopped) leaves no L1 facts behind. Before, they stayed for good: servers
// restarting under new ids (a random UUID per start) filled the view, and
// once it was full every live server's L1 store facts were dropped.
func TestL1FactsReleasedOnDeregister(t *testing.T) {
	defer coordinator.SetMaxL1Facts(2)()
	c := startCoord(t, nil)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-old", "ip": "127.0.0.1", "http_port": 8081}, 200)
	wantReply(t, c.postEvents(cacheBatch("mp-old", 1, 1, "store", "l1", "dram", "t", "a1", 10, "a2", 20)), 1, 0, 0)
	c.wantL1("mp-old", 30, 2)
	c.must("DELETE", "/instances/mp-old", nil, 204)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-new", "ip": "127.0.0.1", "http_port": 8082}, 200)
	wantReply(t, c.postEvents(cacheBatch("mp-new", 1, 1, "store", "l1", "dram", "t", "b1", 5)), 1, 0, 0)
	c.wantL1("mp-new", 5, 1)
	metric(t, c, "lmcache_coordinator_l1_facts_dropped_total 0")
	metric(t, c, "lmcache_coordinator_l1_facts_fenced_total 2")
	// Registering the old id again starts it empty.
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-old", "ip": "127.0.0.1", "http_port": 8081}, 200)
	c.wantL1("mp-old", 0, 0)
}

// TestL1FactsReleasedOnSweep: the same for a server the health sweep drops
// (silent past the instance timeout).
func TestL1FactsReleasedOnSweep(t *testing.T) {
	defer coordinator.SetMaxL1Facts(2)()
	c := startCoord(t, func(cfg *config.Config) {
		cfg.InstanceTimeout = 0.05
		cfg.HealthCheckInterval = 0.02
	})
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-gone", "ip": "127.0.0.1", "http_port": 8081}, 200)
	wantReply(t, c.postEvents(cacheBatch("mp-gone", 1, 1, "store", "l1", "dram", "t", "a1", 10, "a2", 20)), 1, 0, 0)
	waitFor(t, "the silent instance to be swept", func() bool { return len(ids(t, c)) == 0 })
	if n := c.srv.L1Instances(); n != 0 {
		t.Fatalf("L1 view holds %d instances after the sweep, want 0", n)
	}
	metric(t, c, "lmcache_coordinator_l1_facts_fenced_total 2")
}

// TestL1FullViewMakesNoEntries: a full view refuses the facts of new
// instance ids without an entry for each. Before, every refused fact of a
// new id still left an empty entry (its id cloned), so the 1,000,000-fact
// bound did not bound the view.
func TestL1FullViewMakesNoEntries(t *testing.T) {
	defer coordinator.SetMaxL1Facts(1)()
	c := startCoord(t, nil)
	for i, id := range []string{"x-0", "x-1", "x-2", "x-3"} {
		wantReply(t, c.postEvents(cacheBatch(id, 1, 1, "store", "l1", "dram", "t", "a1", 10)), 1, 0, 0)
		if n := c.srv.L1Instances(); n != 1 {
			t.Fatalf("after %d instances' facts the view has %d entries, want 1", i+1, n)
		}
	}
	metric(t, c, "lmcache_coordinator_l1_facts_dropped_total 3")
}
