// Package periodic is the registry of the server's periodic loops (upstream's
// PeriodicThreadRegistry): each loop runs one cycle per interval on its own
// goroutine, and the registry reports level, interval, runs, failures, last
// run and last summary for the /periodic-threads routes.
package periodic

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"sort"
	"sync"
	"time"
)

// Level is a loop's criticality; only critical and high loops count for
// /periodic-threads-health.
type Level string

// The four upstream levels.
const (
	Critical Level = "critical"
	High     Level = "high"
	Medium   Level = "medium"
	Low      Level = "low"
)

// Levels lists every level in upstream order.
var Levels = []Level{Critical, High, Medium, Low}

// ErrInvalidLevel is returned by ParseLevel.
var ErrInvalidLevel = errors.New("invalid level")

// ErrIrrecoverable, wrapped by a cycle's error, records the failure and stops
// the loop, as upstream's irrecoverable exception.
var ErrIrrecoverable = errors.New("irrecoverable periodic failure")

// ParseLevel parses a level name as the HTTP filter accepts it.
func ParseLevel(s string) (Level, error) {
	for _, l := range Levels {
		if string(l) == s {
			return l, nil
		}
	}
	return "", fmt.Errorf("%w: %s. Valid values: critical, high, medium, low", ErrInvalidLevel, s)
}

// Summary is what one cycle reports about itself.
type Summary struct {
	Message string
	Extra   map[string]string
}

// Func runs one cycle. A non-nil error counts as a failed run.
type Func func(ctx context.Context) (Summary, error)

// LabelKey is the pprof goroutine label carrying the loop name, so that
// GET /threads?name= can find a loop's goroutine.
const LabelKey = "name"

// activeFactor is how many intervals may pass without a run before a loop is
// considered inactive (upstream: 3).
const activeFactor = 3

// Loop is one registered periodic loop.
type Loop struct {
	name     string
	level    Level
	interval time.Duration
	initWait time.Duration
	fn       Func
	now      func() time.Time
	// worker: cycles run back to back, no sleep between them; the cycle
	// itself waits for work (at most about one interval, so an idle
	// worker still records runs). See RegisterWorker.
	worker bool

	mu sync.Mutex // guards everything below; held only for bookkeeping, never across fn
	// live counts the calls of Run in progress: a loop Run twice at once
	// (two owners, or a restart overlapping the old run's exit) stays
	// running until the last of them returns, not the first.
	live    int
	started time.Time // when live last went from 0 to 1
	lastRun time.Time
	lastOK  time.Time // start of the last successful cycle
	runs    int64
	failed  int64
	last    *lastSummary
}

type lastSummary struct {
	at       time.Time
	duration time.Duration
	ok       bool
	message  string
	extra    map[string]string
}

// Name returns the loop name.
func (l *Loop) Name() string { return l.name }

// Run executes the loop until ctx is cancelled or a cycle fails with
// ErrIrrecoverable. The goroutine that calls Run owns the loop; the goroutine
// carries the pprof label name=<loop name>. Run may be entered again while
// a call is still in progress (Run returns nothing a refusal could be
// reported through); the loop then reports running until every call has
// returned, and the calls' cycles are counted together.
func (l *Loop) Run(ctx context.Context) {
	pprof.Do(ctx, pprof.Labels(LabelKey, l.name), func(ctx context.Context) {
		l.mu.Lock()
		if l.live == 0 {
			l.started = l.now()
		}
		l.live++
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			l.live--
			l.mu.Unlock()
		}()
		if !sleep(ctx, l.initWait) {
			return
		}
		for {
			if stop := l.cycle(ctx); stop {
				return
			}
			if l.worker {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if !sleep(ctx, l.interval) {
				return
			}
		}
	})
}

// RunOnce executes one cycle synchronously and records it (for tests and for
// callers that drive the loop from their own ticker).
func (l *Loop) RunOnce(ctx context.Context) error {
	start := l.now()
	sum, err := l.safeCall(ctx)
	l.record(start, sum, err)
	return err
}

func (l *Loop) cycle(ctx context.Context) (stop bool) {
	return errors.Is(l.RunOnce(ctx), ErrIrrecoverable)
}

func (l *Loop) safeCall(ctx context.Context) (s Summary, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in periodic loop %s: %v", l.name, r)
		}
	}()
	return l.fn(ctx)
}

func (l *Loop) record(start time.Time, sum Summary, err error) {
	end := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs++
	msg := sum.Message
	if err != nil {
		l.failed++
		msg = err.Error()
	} else {
		l.lastOK = start
	}
	l.lastRun = start
	l.last = &lastSummary{at: start, duration: end.Sub(start), ok: err == nil, message: msg, extra: sum.Extra}
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Status is one loop's report, with upstream's JSON field names.
type Status struct {
	Name        string         `json:"name"`
	Level       Level          `json:"level"`
	Interval    float64        `json:"interval"`
	InitWait    float64        `json:"init_wait"`
	IsRunning   bool           `json:"is_running"`
	IsActive    bool           `json:"is_active"`
	LastRunTime float64        `json:"last_run_time"`
	LastRunAgo  *float64       `json:"last_run_ago"`
	TotalRuns   int64          `json:"total_runs"`
	FailedRuns  int64          `json:"failed_runs"`
	SuccessRate *float64       `json:"success_rate"`
	LastSummary map[string]any `json:"last_summary"`
}

// Status reports the loop.
func (l *Loop) Status() Status {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Status{
		Name: l.name, Level: l.level,
		Interval: l.interval.Seconds(), InitWait: l.initWait.Seconds(),
		IsRunning: l.live > 0, TotalRuns: l.runs, FailedRuns: l.failed,
	}
	window := time.Duration(activeFactor) * l.interval
	if l.live > 0 {
		if l.lastRun.IsZero() {
			s.IsActive = now.Sub(l.started) < l.initWait+window
		} else {
			s.IsActive = now.Sub(l.lastRun) < window
		}
	}
	if !l.lastRun.IsZero() {
		s.LastRunTime = float64(l.lastRun.UnixNano()) / 1e9
		ago := now.Sub(l.lastRun).Seconds()
		s.LastRunAgo = &ago
	}
	if l.runs > 0 {
		rate := 100 * float64(l.runs-l.failed) / float64(l.runs)
		s.SuccessRate = &rate
	}
	if l.last != nil {
		extra := map[string]string{}
		for k, v := range l.last.extra {
			extra[k] = v
		}
		s.LastSummary = map[string]any{
			"timestamp":   float64(l.last.at.UnixNano()) / 1e9,
			"duration_ms": float64(l.last.duration.Microseconds()) / 1000,
			"success":     l.last.ok,
			"message":     l.last.message,
			"extra_info":  extra,
		}
	}
	return s
}

// Registry maps loop names to loops. Re-registering a name replaces the old
// entry, as upstream.
type Registry struct {
	now   func() time.Time
	mu    sync.Mutex
	loops map[string]*Loop
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{now: time.Now, loops: map[string]*Loop{}}
}

// SetClock replaces the clock (tests). Call before registering loops.
func (r *Registry) SetClock(now func() time.Time) { r.now = now }

// Register adds a loop; the caller starts it with Run on a goroutine it owns.
func (r *Registry) Register(name string, level Level, interval, initWait time.Duration, fn Func) *Loop {
	l := &Loop{name: name, level: level, interval: interval, initWait: initWait, fn: fn, now: r.now}
	r.mu.Lock()
	r.loops[name] = l
	r.mu.Unlock()
	return l
}

// RegisterWorker adds a worker loop: its cycles run back to back, and each
// cycle waits for work itself (a queue, a channel) with a timeout of about
// one interval, so an idle worker still completes a cycle per interval and
// stays active, while a cycle that never returns (a wedged upload) makes
// the loop inactive after three intervals, as any periodic loop.
func (r *Registry) RegisterWorker(name string, level Level, interval time.Duration, fn Func) *Loop {
	l := r.Register(name, level, interval, 0, fn)
	l.worker = true
	return l
}

// Unregister removes a loop by name.
func (r *Registry) Unregister(name string) {
	r.mu.Lock()
	delete(r.loops, name)
	r.mu.Unlock()
}

// Get returns one loop's status.
func (r *Registry) Get(name string) (Status, bool) {
	r.mu.Lock()
	l, ok := r.loops[name]
	r.mu.Unlock()
	if !ok {
		return Status{}, false
	}
	return l.Status(), true
}

// All returns every loop's status sorted by name.
func (r *Registry) All() []Status {
	r.mu.Lock()
	loops := make([]*Loop, 0, len(r.loops))
	for _, l := range r.loops {
		loops = append(loops, l)
	}
	r.mu.Unlock()
	out := make([]Status, 0, len(loops))
	for _, l := range loops {
		out = append(out, l.Status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Counts are the per-level summary counts.
type Counts struct {
	Total   int `json:"total"`
	Running int `json:"running"`
	Active  int `json:"active"`
}

// SummaryCounts is the /periodic-threads summary, computed over every loop.
type SummaryCounts struct {
	TotalCount   int              `json:"total_count"`
	RunningCount int              `json:"running_count"`
	ActiveCount  int              `json:"active_count"`
	ByLevel      map[Level]Counts `json:"by_level"`
}

// Summarize counts loops overall and by level.
func Summarize(all []Status) SummaryCounts {
	s := SummaryCounts{ByLevel: map[Level]Counts{}}
	for _, l := range Levels {
		s.ByLevel[l] = Counts{}
	}
	for _, t := range all {
		c := s.ByLevel[t.Level]
		c.Total++
		s.TotalCount++
		if t.IsRunning {
			c.Running++
			s.RunningCount++
		}
		if t.IsActive {
			c.Active++
			s.ActiveCount++
		}
		s.ByLevel[t.Level] = c
	}
	return s
}

// Unhealthy lists critical and high loops that run but are not active.
func Unhealthy(all []Status) []Status {
	var out []Status
	for _, t := range all {
		if (t.Level == Critical || t.Level == High) && t.IsRunning && !t.IsActive {
			out = append(out, t)
		}
	}
	return out
}

// sinceSuccess is the time since the last successful cycle started, since
// the loop started when none has succeeded, and 0 when it is not running.
func (l *Loop) sinceSuccess() time.Duration {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.live == 0:
		return 0
	case l.lastOK.IsZero():
		return now.Sub(l.started)
	}
	return now.Sub(l.lastOK)
}
