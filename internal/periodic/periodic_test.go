package periodic

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestStatusCountsAndSummary(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	r := NewRegistry()
	r.SetClock(clk.now)
	n := 0
	l := r.Register("a", High, 2*time.Second, 0, func(context.Context) (Summary, error) {
		n++
		if n == 3 {
			return Summary{}, errors.New("boom")
		}
		return Summary{Message: fmt.Sprint("run ", n), Extra: map[string]string{"n": fmt.Sprint(n)}}, nil
	})
	st, _ := r.Get("a")
	if st.TotalRuns != 0 || st.LastRunAgo != nil || st.SuccessRate != nil || st.LastSummary != nil || st.IsRunning {
		t.Fatalf("fresh status = %+v", st)
	}
	for i := 0; i < 4; i++ {
		_ = l.RunOnce(context.Background())
	}
	clk.add(1500 * time.Millisecond)
	st, _ = r.Get("a")
	if st.TotalRuns != 4 || st.FailedRuns != 1 || *st.SuccessRate != 75 || *st.LastRunAgo != 1.5 || st.LastRunTime != 1000 {
		t.Fatalf("status = %+v", st)
	}
	if st.LastSummary["message"] != "run 4" || st.LastSummary["success"] != true {
		t.Fatalf("last summary = %v", st.LastSummary)
	}
	// Not running → never active, never unhealthy.
	if st.IsActive || len(Unhealthy(r.All())) != 0 {
		t.Fatalf("idle loop active=%v", st.IsActive)
	}
	s := Summarize(r.All())
	if s.TotalCount != 1 || s.ByLevel[High].Total != 1 || s.ByLevel[Low].Total != 0 || len(s.ByLevel) != 4 {
		t.Fatalf("summary = %+v", s)
	}
}

func TestRunActiveAndUnhealthy(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	r := NewRegistry()
	r.SetClock(clk.now)
	ran := make(chan struct{}, 100)
	l := r.Register("loop", Critical, time.Hour, 0, func(context.Context) (Summary, error) {
		ran <- struct{}{}
		return Summary{}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	<-ran
	st, _ := r.Get("loop")
	if !st.IsRunning || !st.IsActive {
		t.Fatalf("running loop = %+v", st)
	}
	clk.add(3 * time.Hour)
	bad := Unhealthy(r.All())
	if len(bad) != 1 || bad[0].Name != "loop" {
		t.Fatalf("unhealthy = %+v", bad)
	}
	cancel()
	<-done
	if st, _ := r.Get("loop"); st.IsRunning {
		t.Fatal("still running after cancel")
	}
}

func TestIrrecoverableStopsAndPanicCounts(t *testing.T) {
	r := NewRegistry()
	calls := 0
	l := r.Register("x", Medium, time.Millisecond, 0, func(context.Context) (Summary, error) {
		calls++
		if calls == 1 {
			panic("kaboom")
		}
		return Summary{}, fmt.Errorf("fatal: %w", ErrIrrecoverable)
	})
	l.Run(context.Background()) // returns by itself after the irrecoverable error
	st, _ := r.Get("x")
	if calls != 2 || st.TotalRuns != 2 || st.FailedRuns != 2 || st.IsRunning {
		t.Fatalf("calls %d status %+v", calls, st)
	}
	if _, err := ParseLevel("urgent"); !errors.Is(err, ErrInvalidLevel) {
		t.Fatal("urgent accepted")
	}
	r.Unregister("x")
	if _, ok := r.Get("x"); ok {
		t.Fatal("unregistered loop still listed")
	}
}

// TestWorkerLoop: a worker loop runs its cycles back to back (no interval
// sleep between them: ten cycles complete although the interval is an
// hour); a cycle that never returns makes the loop inactive after three
// intervals, so Unhealthy reports it, and it is healthy again once the
// cycle returns.
func TestWorkerLoop(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	r := NewRegistry()
	r.SetClock(clk.now)
	work := make(chan bool) // true: wedge the cycle until release
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	l := r.RegisterWorker("w", High, time.Hour, func(ctx context.Context) (Summary, error) {
		select {
		case wedge := <-work:
			if wedge {
				entered <- struct{}{}
				<-release
			}
		case <-ctx.Done():
		}
		return Summary{Message: "ok"}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	for range 10 {
		work <- false
	}
	work <- true
	<-entered
	st, _ := r.Get("w")
	if st.TotalRuns < 10 || !st.IsRunning || !st.IsActive || st.Interval != 3600 {
		t.Fatalf("worker after 10 cycles: %+v", st)
	}
	clk.add(3*time.Hour + time.Second)
	if un := Unhealthy(r.All()); len(un) != 1 || un[0].Name != "w" {
		t.Fatalf("wedged worker not reported: %+v", un)
	}
	close(release)
	work <- false // the next cycle records a fresh run
	work <- false
	if un := Unhealthy(r.All()); len(un) != 0 {
		t.Fatalf("recovered worker still unhealthy: %+v", un)
	}
	cancel()
	<-done
	if st, _ := r.Get("w"); st.IsRunning {
		t.Fatalf("stopped worker still running: %+v", st)
	}
}

// TestConcurrentRunsStayRunning: one loop whose Run is entered twice at
// once reports running until the second call returns too; the first call
// returning does not mark the live loop stopped (before, it did: the page
// said is_running false while a run was still cycling).
func TestConcurrentRunsStayRunning(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	r := NewRegistry()
	r.SetClock(clk.now)
	entered := make(chan struct{})
	l := r.Register("twice", High, time.Hour, 0, func(ctx context.Context) (Summary, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return Summary{}, ctx.Err()
	})
	run := func(ctx context.Context) chan struct{} {
		done := make(chan struct{})
		go func() { defer close(done); l.Run(ctx) }()
		return done
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	done1, done2 := run(ctx1), run(ctx2)
	<-entered // both calls are inside a cycle
	<-entered
	cancel1()
	<-done1
	st, _ := r.Get("twice")
	if !st.IsRunning || !st.IsActive || st.TotalRuns != 1 {
		t.Fatalf("one of two runs returned: is_running=%v is_active=%v total_runs=%d, want true true 1", st.IsRunning, st.IsActive, st.TotalRuns)
	}
	if s := Summarize(r.All()); s.RunningCount != 1 || s.ByLevel[High].Running != 1 {
		t.Fatalf("summary with one live run = %+v", s)
	}
	if got := l.sinceSuccess(); got != 0 { // running, no success: since start, 0 s on the fake clock
		t.Fatalf("sinceSuccess = %v, want 0 (live, started now)", got)
	}
	clk.add(5 * time.Second)
	if got := l.sinceSuccess(); got != 5*time.Second {
		t.Fatalf("sinceSuccess = %v, want 5s (still live)", got)
	}
	cancel2()
	<-done2
	st, _ = r.Get("twice")
	if st.IsRunning || st.IsActive || st.TotalRuns != 2 {
		t.Fatalf("both runs returned: %+v", st)
	}
	if got := l.sinceSuccess(); got != 0 {
		t.Fatalf("stopped loop sinceSuccess = %v, want 0", got)
	}
}
