package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPercentFor(t *testing.T) {
	for _, c := range []struct {
		live, floor uint64
		base, want  int
	}{
		{7 << 20, 64 << 20, 100, 814},   // (64-7)/7
		{32 << 20, 64 << 20, 100, 100},  // the base already reaches the floor
		{64 << 20, 64 << 20, 100, 100},  // at the floor
		{1 << 30, 64 << 20, 100, 100},   // far above it
		{7 << 20, 64 << 20, 1000, 1000}, // a larger base is kept
		{1, 64 << 20, 100, maxPercent},  // bounded
		{16 << 20, 64 << 20, 50, 300},   // GOGC=50
	} {
		if got := percentFor(c.live, c.floor, c.base); got != c.want {
			t.Errorf("percentFor(%d, %d, %d) = %d, want %d", c.live, c.floor, c.base, got, c.want)
		}
	}
}

func TestBasePercent(t *testing.T) {
	for env, want := range map[string]int{"": 100, "200": 200, "0": 0, "x": 100, "-5": 100} {
		if got, ok := basePercent(env); !ok || got != want {
			t.Errorf("basePercent(%q) = %d, %v; want %d", env, got, ok, want)
		}
	}
	if _, ok := basePercent("off"); ok {
		t.Error(`basePercent("off") kept the collector's percent; want no floor`)
	}
}

// TestFloorRaisesGoalAfterEachCycle: with a floor far above the live
// heap, the percent after a collection puts the runtime's own heap goal at
// the floor or above; Stop restores the base percent.
func TestFloorRaisesGoalAfterEachCycle(t *testing.T) {
	t.Setenv("GOGC", "100")
	const floor = 256 << 20
	f := Start(floor)
	if f == nil {
		t.Fatal("Start returned no floor")
	}
	defer f.Stop()
	runtime.GC()
	// The finalizer runs on the runtime's finalizer goroutine after the
	// cycle; wait for the percent it sets, with a deadline.
	deadline := time.Now().Add(10 * time.Second)
	for f.Percent() <= 100 {
		if time.Now().After(deadline) {
			t.Fatalf("percent still %d 10 s after a collection", f.Percent())
		}
		runtime.GC()
		runtime.Gosched()
	}
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}, {Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if goal := s[0].Value.Uint64(); goal < floor*9/10 {
		t.Fatalf("heap goal %d with percent %d; want about the floor %d", goal, f.Percent(), floor)
	}
	if got := s[1].Value.Uint64(); got != uint64(f.Percent()) {
		t.Fatalf("runtime percent %d, floor set %d", got, f.Percent())
	}
	f.Stop()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("after Stop the percent is %d, want the base 100", got)
	}
}

func TestNoFloorWhenOffOrZero(t *testing.T) {
	t.Setenv("GOGC", "off")
	if f := Start(64 << 20); f != nil {
		t.Fatal("GOGC=off: Start set a floor")
	}
	t.Setenv("GOGC", "")
	if f := Start(0); f != nil {
		t.Fatal("floor 0: Start set a floor")
	}
	var f *Floor
	f.Stop() // nil-safe
}
