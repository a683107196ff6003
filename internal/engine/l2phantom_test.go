package engine

import (
	"context"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestL2EvictionPassesKeysItCannotDelete: L2 eviction does not stall on
// victims the adapter keeps. Keys another server sharing the tier removed
// (no event reached this policy) are the least recent, and the adapter's
// Delete reports them not deleted; they were the victims of every cycle
// after, so once they filled the cycle's target nothing was ever evicted
// again though the tier stayed over its watermark. Now a kept victim goes
// to the most recent end and the next cycle takes the keys after it.
func TestL2EvictionPassesKeysItCannotDelete(t *testing.T) {
	fake := newFake("shared")
	fake.capacity = 4 * objSize
	e, err := New(Config{L1SizeBytes: 16 * objSize, L2: []AdapterConfig{
		{Eviction: &l2.EvictionConfig{Policy: PolicyLRU, TriggerWatermark: 0.5, EvictionRatio: 0.5}},
	}}, []l2.Adapter{fake}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeChecked(t, e)
	keys := flat(chunks("", 0, 4, 1))
	for _, k := range keys { // one store each: keys[0] is the least recent
		if err := fake.Store(context.Background(), []objkey.Key{k}, [][]byte{pattern(k, objSize)}); err != nil {
			t.Fatal(err)
		}
	}
	// Another server sharing the tier deleted the two oldest.
	fake.mu.Lock()
	delete(fake.objs, keys[0])
	delete(fake.objs, keys[1])
	fake.mu.Unlock()
	evicted := 0
	for range 3 {
		n, err := e.l2EvictOnce(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		evicted += n
	}
	if evicted != 2 || fake.count() != 0 {
		t.Fatalf("3 cycles evicted %d objects and left %d on a tier at 50%% of capacity (watermark 0.5), want both evicted", evicted, fake.count())
	}
}
