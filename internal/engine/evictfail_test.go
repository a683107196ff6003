package engine

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fault"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
)

// TestL2EvictionDeleteFailureCounted: an fs adapter full of recovered
// files behind the fault_inject wrapper. While the wrapper fails every
// call, each L2 eviction cycle counts one delete failure for the adapter
// and returns the (wrapped) injected error, which is what makes the
// periodic loop count a failed run; nothing is evicted and every file
// stays. Once the wrapper recovers, one cycle evicts half the files and
// the failure count stays where it was. The loop's interval is an hour,
// so only the test drives cycles and the counts are exact.
func TestL2EvictionDeleteFailureCounted(t *testing.T) {
	dir := t.TempDir()
	storeEarlier(t, dir, 10)
	inner, err := fs.New(fs.Config{BasePath: dir, PersistEnabled: true, RecoverOnStart: true, MaxCapacityBytes: 10 * objSize})
	if err != nil {
		t.Fatal(err)
	}
	fa := fault.New(inner, fault.Config{})
	defer fa.Close()
	h := start(t, Config{EvictionInterval: time.Hour, L2: []AdapterConfig{
		{Eviction: &l2.EvictionConfig{Policy: PolicyLRU, TriggerWatermark: 0.8, EvictionRatio: 0.5}},
	}}, fa)
	defer h.stop(t)

	fa.SetFailing(true)
	for range 3 {
		if _, err := h.l2EvictCycle(context.Background()); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("cycle with a failing Delete returned %v, want the injected fault", err)
		}
	}
	if c := h.Counters().L2[0]; c.EvictionDeleteFailed != 3 || c.EvictedObjects != 0 || c.EvictionTicks != 3 {
		t.Fatalf("after 3 failing cycles: delete failures %d, evicted %d, ticks %d; want 3, 0, 3",
			c.EvictionDeleteFailed, c.EvictedObjects, c.EvictionTicks)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 10 {
		t.Fatalf("%d files left (%v), want all 10", len(ents), err)
	}

	fa.SetFailing(false)
	sum, err := h.l2EvictCycle(context.Background())
	if err != nil || sum.Message != "evicted=5" {
		t.Fatalf("recovered cycle: %q, %v; want evicted=5 and no error", sum.Message, err)
	}
	if c := h.Counters().L2[0]; c.EvictionDeleteFailed != 3 || c.EvictedObjects != 5 {
		t.Fatalf("after recovery: delete failures %d, evicted %d; want 3, 5", c.EvictionDeleteFailed, c.EvictedObjects)
	}
}
