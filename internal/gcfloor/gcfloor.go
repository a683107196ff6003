// Package gcfloor keeps the Go garbage collector from starting while the
// heap is small.
//
// With the default GOGC of 100 a collection starts when the heap has grown
// by its live size. The server's live Go heap is small (a few MiB: its KV
// data lives in the shared-memory pool, outside the Go heap) while every
// ZMQ request copies its key frames into the heap (a 32k-token key is
// 160 KiB, sent with LOOKUP, FREE_LOOKUP_LOCKS and each transfer), so at
// GOGC=100 collections come often and overlap requests: 21 in one
// 300-sample `lmcache bench` run against 7 with the default floor
// (BENCHMARKS.md, round R). A floor under the
// heap goal makes collections rare while the heap is small, and changes
// nothing once the live heap is large enough that GOGC alone puts the
// goal above the floor.
//
// Go has no setting for a minimum heap goal, so after every collection
// the percent is set to what puts the next goal at the floor (never below
// the base percent, GOGC from the environment or 100). The hook is a
// finalizer on a sentinel object that re-arms itself: it runs on the
// runtime's finalizer goroutine once per cycle, so it owns no goroutine.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
)

// maxPercent bounds the percent the floor may set (a 1 KiB live heap and
// a 64 MiB floor would otherwise ask for millions).
const maxPercent = 1 << 16

// Floor is a running floor; Stop ends it.
type Floor struct {
	floor   uint64
	base    int
	stopped atomic.Bool
	percent atomic.Int64
}

// sentinel is the object whose finalizer marks the end of a GC cycle. It
// holds a pointer so that it is not placed by the tiny allocator, whose
// objects may never be finalized.
type sentinel struct {
	f *Floor
	_ [16]byte
}

// Start sets a floor of floor bytes under the heap goal. It returns nil
// (no floor) when floor <= 0 or the environment turned the collector off
// (GOGC=off): an operator's explicit choice is left alone.
func Start(floor int64) *Floor {
	base, ok := basePercent(os.Getenv("GOGC"))
	if floor <= 0 || !ok {
		return nil
	}
	f := &Floor{floor: uint64(floor), base: base}
	f.percent.Store(int64(base))
	f.adjust()
	f.arm()
	return f
}

// basePercent is GOGC's percent: 100 when unset or unparsable (as the
// runtime reads it), false for "off".
func basePercent(env string) (int, bool) {
	if env == "off" {
		return 0, false
	}
	if v, err := strconv.Atoi(env); err == nil && v >= 0 {
		return v, true
	}
	return 100, true
}

// Percent is the GOGC percent the floor set last.
func (f *Floor) Percent() int { return int(f.percent.Load()) }

// Stop restores the base percent; the hook disarms at the next cycle.
// Safe on a nil Floor.
func (f *Floor) Stop() {
	if f == nil || f.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(f.base)
	f.percent.Store(int64(f.base))
}

func (f *Floor) arm() {
	runtime.SetFinalizer(&sentinel{f: f}, func(s *sentinel) {
		if s.f.stopped.Load() {
			return
		}
		s.f.adjust()
		s.f.arm()
	})
}

// adjust sets the percent for the next cycle from the live heap the last
// one marked.
func (f *Floor) adjust() {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 || sample[0].Value.Uint64() == 0 {
		// No cycle has marked the heap yet: the runtime's first goal
		// (4 MiB at GOGC=100) stands, and the hook adjusts after it.
		return
	}
	p := percentFor(sample[0].Value.Uint64(), f.floor, f.base)
	if f.stopped.Load() {
		return
	}
	if int64(p) != f.percent.Load() {
		debug.SetGCPercent(p)
		f.percent.Store(int64(p))
	}
}

// percentFor is the percent that puts the goal, live*(1+p/100), at floor,
// or base when that already does.
func percentFor(live, floor uint64, base int) int {
	if live >= floor {
		return base
	}
	p := (floor - live) * 100 / live
	return int(min(max(p, uint64(base)), maxPercent))
}
