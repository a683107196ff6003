// Package fault is the "fault_inject" L2 adapter: a wrapper around any
// adapter that injects failures and latency, for reliability tests.
//
// From the JSON config it does what upstream's does — drop a deterministic
// subset of keys at load time (lookup says present, load fails) through
// rate/seed/gap_indices/gap_tail_ratios — plus lmcache-go extensions:
// "failing" (every data call fails, as during an outage), "error_rate"
// (each data call fails with that probability) and "latency_ms" (added
// before each data call, honouring ctx). Tests also drive it at run time
// with SetFailing, SetErrorRate and SetLatency.
//
// Concurrency: the knobs are atomics, read once per call; the wrapper owns
// no goroutines.
package fault

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TypeName is the registered --l2-adapter type.
const TypeName = "fault_inject"

// ErrInjected is returned by injected failures. It wraps l2.ErrUnavailable
// so callers treat it like a real outage.
var ErrInjected = fmt.Errorf("%w: injected fault", l2.ErrUnavailable)

const hashDenom = 1_000_000

// Config configures the wrapper (the inner adapter is opened separately).
type Config struct {
	Inner         l2.Spec // "inner" (required): the wrapped adapter's spec
	Rate          float64 // "rate": per-key load drop probability in [0,1]
	Seed          int64   // "seed": drop hash seed
	GapIndices    []int   // "gap_indices": load positions always dropped
	GapTailRatios []float64
	Failing       bool    // "failing" (extension)
	ErrorRate     float64 // "error_rate" (extension)
	LatencyMS     float64 // "latency_ms" (extension)
}

func init() {
	l2.Register(TypeName, l2.Factory{
		Parse: func(f *l2.Fields) (any, error) { return ParseConfig(f) },
		Open: func(ctx context.Context, spec l2.Spec) (l2.Adapter, error) {
			cfg := spec.Options.(Config)
			cfg.Inner.Index = spec.Index
			inner, err := l2.Open(ctx, cfg.Inner)
			if err != nil {
				return nil, fmt.Errorf("inner adapter: %w", err)
			}
			return New(inner, cfg), nil
		},
	})
}

// ParseConfig decodes the fault_inject keys, including the inner spec.
func ParseConfig(f *l2.Fields) (Config, error) {
	var c Config
	raw := f.Raw("inner")
	if raw == nil {
		return c, errors.New("'inner' must be an adapter spec dict with a 'type' field")
	}
	inner, err := l2.ParseNested(raw)
	if err != nil {
		return c, err
	}
	c.Inner = inner
	if c.Rate, err = unit(f, "rate"); err != nil {
		return c, err
	}
	if c.Seed, err = f.Int("seed", 0); err != nil {
		return c, err
	}
	if f.Has("gap_indices") {
		var idx []int
		if err := jsonInto(f.Raw("gap_indices"), &idx); err != nil || hasNegative(idx) {
			return c, errors.New("gap_indices must be a list of non-negative integers")
		}
		c.GapIndices = idx
	} else {
		f.Raw("gap_indices")
	}
	if f.Has("gap_tail_ratios") {
		var r []float64
		if err := jsonInto(f.Raw("gap_tail_ratios"), &r); err != nil || !allUnit(r) {
			return c, errors.New("gap_tail_ratios must be a list of floats in [0, 1]")
		}
		c.GapTailRatios = r
	} else {
		f.Raw("gap_tail_ratios")
	}
	if c.Failing, err = f.Bool("failing", false); err != nil {
		return c, err
	}
	if c.ErrorRate, err = unit(f, "error_rate"); err != nil {
		return c, err
	}
	if c.LatencyMS, err = f.Float("latency_ms", 0); err != nil {
		return c, err
	}
	if c.LatencyMS < 0 {
		return c, errors.New("latency_ms must be >= 0")
	}
	return c, nil
}

func unit(f *l2.Fields, key string) (float64, error) {
	v, err := f.Float(key, 0)
	if err != nil {
		return 0, err
	}
	if v < 0 || v > 1 {
		return 0, fmt.Errorf("%s must be a number in [0, 1]", key)
	}
	return v, nil
}

func hasNegative(xs []int) bool {
	for _, x := range xs {
		if x < 0 {
			return true
		}
	}
	return false
}

func allUnit(xs []float64) bool {
	for _, x := range xs {
		if x < 0 || x > 1 {
			return false
		}
	}
	return true
}

// Adapter is the fault-injecting wrapper.
type Adapter struct {
	inner l2.Adapter
	cfg   Config
	gaps  map[int]bool

	failing   atomic.Bool
	errorRate atomic.Uint64 // math.Float64bits
	latency   atomic.Int64  // nanoseconds
	injected  atomic.Int64
	dropped   atomic.Int64
}

var _ l2.Adapter = (*Adapter)(nil)

// New wraps inner; the wrapper closes inner on Close.
func New(inner l2.Adapter, cfg Config) *Adapter {
	a := &Adapter{inner: inner, cfg: cfg, gaps: map[int]bool{}}
	for _, g := range cfg.GapIndices {
		a.gaps[g] = true
	}
	a.SetFailing(cfg.Failing)
	a.SetErrorRate(cfg.ErrorRate)
	a.SetLatency(time.Duration(cfg.LatencyMS * float64(time.Millisecond)))
	return a
}

// Inner returns the wrapped adapter.
func (a *Adapter) Inner() l2.Adapter { return a.inner }

// SetFailing makes every data call fail (true) or pass through (false).
func (a *Adapter) SetFailing(on bool) { a.failing.Store(on) }

// SetErrorRate sets the probability that a data call fails.
func (a *Adapter) SetErrorRate(p float64) { a.errorRate.Store(math.Float64bits(p)) }

// SetLatency sets the delay added before each data call.
func (a *Adapter) SetLatency(d time.Duration) { a.latency.Store(int64(d)) }

// Recovered passes through the inner adapter's start-up scan (fs
// recover_on_start), so the engine seeds eviction through the wrapper too.
func (a *Adapter) Recovered() ([]objkey.Key, []int64) {
	if r, ok := a.inner.(interface {
		Recovered() ([]objkey.Key, []int64)
	}); ok {
		return r.Recovered()
	}
	return nil, nil
}

// before applies latency and decides whether this call fails.
func (a *Adapter) before(ctx context.Context) error {
	if d := time.Duration(a.latency.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("fault_inject: %w", ctx.Err())
		}
	}
	fail := a.failing.Load()
	if !fail {
		if p := math.Float64frombits(a.errorRate.Load()); p > 0 && rand.Float64() < p {
			fail = true
		}
	}
	if fail {
		a.injected.Add(1)
		return ErrInjected
	}
	return nil
}

// TypeName implements l2.Adapter.
func (a *Adapter) TypeName() string { return TypeName }

// Store implements l2.Adapter.
func (a *Adapter) Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error {
	if err := a.before(ctx); err != nil {
		return err
	}
	return a.inner.Store(ctx, keys, objs)
}

// LookupAndLock implements l2.Adapter; an injected failure locks nothing.
func (a *Adapter) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	if err := a.before(ctx); err != nil {
		return make([]bool, len(keys)), err
	}
	return a.inner.LookupAndLock(ctx, keys)
}

// Unlock implements l2.Adapter (never faulted: unlocks must succeed).
func (a *Adapter) Unlock(keys []objkey.Key) { a.inner.Unlock(keys) }

// Load implements l2.Adapter and clears the bits of dropped positions.
func (a *Adapter) Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error) {
	if err := a.before(ctx); err != nil {
		return make([]bool, len(keys)), err
	}
	ok, err := a.inner.Load(ctx, keys, dst)
	if err != nil {
		return ok, err
	}
	for _, i := range a.dropPositions(keys) {
		if ok[i] {
			ok[i] = false
			a.dropped.Add(1)
		}
	}
	return ok, nil
}

// dropPositions mirrors upstream's rule: tail-ratio slots, exact gap
// indices, and keys whose seeded hash falls under rate.
func (a *Adapter) dropPositions(keys []objkey.Key) []int {
	n := len(keys)
	ratio := map[int]bool{}
	if n > 0 {
		for _, r := range a.cfg.GapTailRatios {
			ratio[int(math.RoundToEven((1-r)*float64(n-1)))] = true
		}
	}
	var out []int
	for i, k := range keys {
		if ratio[i] || a.gaps[i] || a.dropKey(k) {
			out = append(out, i)
		}
	}
	return out
}

func (a *Adapter) dropKey(k objkey.Key) bool {
	if a.cfg.Rate <= 0 {
		return false
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d:%s:%s:%d:%d:%s", a.cfg.Seed, k.HashHex(), k.ModelName, k.KVRank, k.ObjectGroupID, k.CacheSalt)
	return h.Sum64()%hashDenom < uint64(a.cfg.Rate*hashDenom)
}

// Delete implements l2.Adapter.
func (a *Adapter) Delete(ctx context.Context, keys []objkey.Key) ([]objkey.Key, error) {
	if err := a.before(ctx); err != nil {
		return nil, err
	}
	return a.inner.Delete(ctx, keys)
}

// List implements l2.Adapter.
func (a *Adapter) List(ctx context.Context, modelName string, pageSize int, pageToken string) (l2.Page, error) {
	if err := a.before(ctx); err != nil {
		return l2.Page{}, err
	}
	return a.inner.List(ctx, modelName, pageSize, pageToken)
}

// Usage implements l2.Adapter (the inner adapter's).
func (a *Adapter) Usage() l2.Usage { return a.inner.Usage() }

// Status implements l2.Adapter: the inner status plus a "fault_inject" block.
func (a *Adapter) Status() map[string]any {
	st := map[string]any{}
	for k, v := range a.inner.Status() {
		st[k] = v
	}
	st["fault_inject"] = map[string]any{
		"inner_type":     a.inner.TypeName(),
		"failing":        a.failing.Load(),
		"error_rate":     math.Float64frombits(a.errorRate.Load()),
		"latency_ms":     float64(a.latency.Load()) / float64(time.Millisecond),
		"rate":           a.cfg.Rate,
		"seed":           a.cfg.Seed,
		"injected_calls": a.injected.Load(),
		"dropped_loads":  a.dropped.Load(),
	}
	if a.failing.Load() {
		st["is_healthy"] = false
	}
	return st
}

// AddListener implements l2.Adapter.
func (a *Adapter) AddListener(l l2.Listener) { a.inner.AddListener(l) }

// Close closes the inner adapter.
func (a *Adapter) Close() error { return a.inner.Close() }
