package engine

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestLoopsRegistered: every background loop of the engine is in the
// registry it was given, with its level and interval, and runs.
func TestLoopsRegistered(t *testing.T) {
	reg := periodic.NewRegistry()
	a, b := newFake("a"), newFake("b")
	h := start(t, Config{Loops: reg, EvictionInterval: 5 * time.Millisecond, WorkerLoopInterval: 10 * time.Millisecond, L2PrefetchMaxInFlight: 2,
		L2: []AdapterConfig{{Eviction: &l2.EvictionConfig{Policy: PolicyLRU}}}}, a, b)
	defer h.stop(t)
	want := map[string]struct {
		level    periodic.Level
		interval float64
	}{
		LoopL1Eviction:          {periodic.High, 0.005},
		LoopL2Eviction:          {periodic.Medium, 0.005},
		LoopStorePrefix + "0-0": {periodic.High, 0.01}, LoopStorePrefix + "0-1": {periodic.High, 0.01},
		LoopStorePrefix + "1-0": {periodic.High, 0.01}, LoopStorePrefix + "1-1": {periodic.High, 0.01},
		LoopPrefetchPrefix + "0": {periodic.Medium, 0.01}, LoopPrefetchPrefix + "1": {periodic.Medium, 0.01},
	}
	waitFor(t, func() bool {
		for _, st := range reg.All() {
			if st.TotalRuns < 2 {
				return false
			}
		}
		return len(reg.All()) == len(want)
	})
	var names []string
	for _, st := range reg.All() {
		names = append(names, st.Name)
		w, ok := want[st.Name]
		if !ok || st.Level != w.level || st.Interval != w.interval || !st.IsRunning || st.FailedRuns != 0 {
			t.Errorf("loop %+v, want %+v", st, w)
		}
	}
	if len(names) != len(want) {
		t.Fatalf("loops %q, want %d", names, len(want))
	}
}

// TestWedgedStoreWorkerUnhealthy: an adapter whose upload never returns
// wedges a store worker's cycle; after three intervals without a run that
// worker is reported by periodic.Unhealthy (what /periodic-threads-health
// serves) while the other loops stay healthy; once the upload returns the
// report clears.
func TestWedgedStoreWorkerUnhealthy(t *testing.T) {
	reg := periodic.NewRegistry()
	a := newFake("stuck")
	a.storeGate = make(chan struct{})
	// Intervals long enough that a loaded machine does not make a healthy
	// loop miss three of them; the wedged one misses every one.
	h := start(t, Config{Loops: reg, EvictionInterval: time.Second, WorkerLoopInterval: 200 * time.Millisecond}, a)
	defer h.stop(t)
	h.mustPut(t, flat(chunks("", 0, 1, 1)))
	var un []periodic.Status
	waitFor(t, func() bool { un = periodic.Unhealthy(reg.All()); return len(un) > 0 })
	if len(un) != 1 || !strings.HasPrefix(un[0].Name, LoopStorePrefix+"0-") || un[0].Level != periodic.High {
		t.Fatalf("unhealthy = %+v, want exactly one store worker of adapter 0", un)
	}
	var healthy []string
	for _, st := range reg.All() {
		if st.IsActive {
			healthy = append(healthy, st.Name)
		}
	}
	if !slices.Contains(healthy, LoopL1Eviction) {
		t.Fatalf("the L1 eviction loop went inactive too: active %q", healthy)
	}
	close(a.storeGate)
	waitFor(t, func() bool { return len(periodic.Unhealthy(reg.All())) == 0 })
	waitFor(t, func() bool { return h.Counters().L2[0].StoreObjects == 1 })
}
