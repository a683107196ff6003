package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/l1"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/quota"
)

// Defaults (upstream's unless noted).
const (
	DefaultAlignBytes       = 4096
	DefaultReadTTL          = 300 * time.Second
	DefaultWriteTTL         = 600 * time.Second
	DefaultWatermark        = 0.8
	DefaultEvictionRatio    = 0.2
	DefaultEvictionInterval = time.Second
	DefaultMaxInFlight      = 8
	// Ours: bounded write-behind retries (upstream does not retry).
	DefaultStoreMaxAttempts = 8
	DefaultStoreRetryBase   = 100 * time.Millisecond
	DefaultStoreRetryMax    = 30 * time.Second
	// Ours: the interval store and prefetch workers report.
	DefaultWorkerLoopInterval = 10 * time.Second
)

// Names of the engine's loops in the periodic registry. Store workers are
// LoopStorePrefix<adapter index>-<n>, prefetch workers LoopPrefetchPrefix<n>.
const (
	LoopL1Eviction     = "lmcache-engine-l1-eviction"
	LoopL2Eviction     = "lmcache-engine-l2-eviction"
	LoopStorePrefix    = "lmcache-engine-store-"
	LoopPrefetchPrefix = "lmcache-engine-prefetch-"
)

// Engine is the storage manager. Build it with New.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	pool     *l1.Pool
	table    *l1.Table
	quotas   *quota.Manager
	adapters []l2.Adapter
	l2pol    []*eviction.Locked // per adapter; nil = no L2 eviction

	running atomic.Bool // Run was called
	ready   atomic.Bool // Run is serving
	stopped atomic.Bool // Run's ctx ended; no new background work
	exited  atomic.Bool // Run returned: no goroutine of it touches the pool

	st liveStats

	layouts layoutRegistry

	listenMu  sync.RWMutex
	listeners []L1Listener
	// evOrder (capacity 1) is held, while listeners are registered, from
	// a change to what L1 holds until the listeners have heard of it, so
	// they hear of changes in the order the table made them (see
	// lockEvents). A channel, not a mutex: a waiter is durably blocked in
	// a synctest bubble.
	evOrder chan struct{}

	store *storeCtl
	pf    *prefetchCtl
	seq   atomic.Uint64 // unique writer tags for Put/Get
}

func (c Config) withDefaults() (Config, error) {
	if c.L1SizeBytes <= 0 {
		return c, fmt.Errorf("%w: L1 size must be positive (got %d bytes)", ErrInvalid, c.L1SizeBytes)
	}
	if c.L1AlignBytes == 0 {
		c.L1AlignBytes = DefaultAlignBytes
	}
	if c.L1AlignBytes < 0 || c.L1AlignBytes&(c.L1AlignBytes-1) != 0 {
		return c, fmt.Errorf("%w: --l1-align-bytes must be a power of two (got %d)", ErrInvalid, c.L1AlignBytes)
	}
	c.L1ReadTTL = cmp.Or(c.L1ReadTTL, DefaultReadTTL)
	c.L1WriteTTL = cmp.Or(c.L1WriteTTL, DefaultWriteTTL)
	if c.L1ReadTTL < 0 || c.L1WriteTTL < 0 {
		return c, fmt.Errorf("%w: lease TTLs must be positive", ErrInvalid)
	}
	c.EvictionPolicy = cmp.Or(c.EvictionPolicy, PolicyLRU)
	if _, err := eviction.New(c.EvictionPolicy); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c.EvictionTriggerWatermark = cmp.Or(c.EvictionTriggerWatermark, DefaultWatermark)
	c.EvictionRatio = cmp.Or(c.EvictionRatio, DefaultEvictionRatio)
	if c.EvictionTriggerWatermark < 0 || c.EvictionTriggerWatermark > 1 || c.EvictionRatio < 0 || c.EvictionRatio > 1 {
		return c, fmt.Errorf("%w: eviction watermark and ratio must be in [0,1]", ErrInvalid)
	}
	c.EvictionInterval = cmp.Or(c.EvictionInterval, DefaultEvictionInterval)
	c.L2StorePolicy = cmp.Or(c.L2StorePolicy, StorePolicyDefault)
	if c.L2StorePolicy != StorePolicyDefault && c.L2StorePolicy != StorePolicySkipL1 {
		return c, fmt.Errorf("%w: --l2-store-policy %q (want default or skip_l1)", ErrInvalid, c.L2StorePolicy)
	}
	c.L2PrefetchPolicy = cmp.Or(c.L2PrefetchPolicy, PrefetchPolicyDefault)
	if c.L2PrefetchPolicy != PrefetchPolicyDefault && c.L2PrefetchPolicy != PrefetchPolicyRetain {
		return c, fmt.Errorf("%w: --l2-prefetch-policy %q (want default or retain)", ErrInvalid, c.L2PrefetchPolicy)
	}
	c.L2PrefetchMaxInFlight = cmp.Or(c.L2PrefetchMaxInFlight, DefaultMaxInFlight)
	if c.L2PrefetchMaxInFlight < 0 || c.L2PrefetchLoadTimeout < 0 || c.L2LookupTimeout < 0 {
		return c, fmt.Errorf("%w: --l2-prefetch-max-in-flight, --l2-prefetch-load-timeout and --l2-lookup-timeout-ms must be positive", ErrInvalid)
	}
	c.StoreMaxAttempts = cmp.Or(c.StoreMaxAttempts, DefaultStoreMaxAttempts)
	c.StoreRetryBase = cmp.Or(c.StoreRetryBase, DefaultStoreRetryBase)
	c.StoreRetryMax = cmp.Or(c.StoreRetryMax, DefaultStoreRetryMax)
	c.WorkerLoopInterval = cmp.Or(c.WorkerLoopInterval, DefaultWorkerLoopInterval)
	if c.Loops == nil {
		c.Loops = periodic.NewRegistry()
	}
	if c.ShmMode == 0 {
		c.ShmMode = 0o600
	}
	for i, a := range c.L2 {
		if a.Eviction == nil {
			continue
		}
		ev := *a.Eviction
		ev.Policy = cmp.Or(ev.Policy, PolicyLRU)
		if _, err := eviction.New(ev.Policy); err != nil {
			return c, fmt.Errorf("%w: --l2-adapter #%d eviction: %w", ErrInvalid, i, err)
		}
		ev.TriggerWatermark = cmp.Or(ev.TriggerWatermark, DefaultWatermark)
		ev.EvictionRatio = cmp.Or(ev.EvictionRatio, DefaultEvictionRatio)
		if ev.TriggerWatermark < 0 || ev.TriggerWatermark > 1 || ev.EvictionRatio < 0 || ev.EvictionRatio > 1 {
			return c, fmt.Errorf("%w: --l2-adapter #%d eviction: watermark and ratio must be in [0,1]", ErrInvalid, i)
		}
		c.L2[i].Eviction = &ev
	}
	return c, nil
}

// New builds an engine over the given adapters (index order = cascade
// order). It maps the pool but starts nothing; call Run.
func New(cfg Config, adapters []l2.Adapter, logger *slog.Logger) (*Engine, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.L2 = slices.Clone(cfg.L2)
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(cfg.L2) > len(adapters) {
		return nil, fmt.Errorf("%w: %d adapter configs for %d adapters", ErrInvalid, len(cfg.L2), len(adapters))
	}
	for len(cfg.L2) < len(adapters) {
		cfg.L2 = append(cfg.L2, AdapterConfig{})
	}
	pool, err := l1.NewPool(l1.PoolConfig{Size: cfg.L1SizeBytes, Align: cfg.L1AlignBytes, ShmName: cfg.ShmName, ShmDir: cfg.ShmDir, ShmMode: cfg.ShmMode, HugePages: cfg.L1UseHugepages})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	table, err := l1.NewTable(l1.TableConfig{Size: pool.Size(), Align: cfg.L1AlignBytes, ReadTTL: cfg.L1ReadTTL, WriteTTL: cfg.L1WriteTTL, Policy: cfg.EvictionPolicy})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	e := &Engine{
		cfg:      cfg,
		log:      logger,
		pool:     pool,
		table:    table,
		quotas:   quota.New(),
		adapters: slices.Clone(adapters),
		l2pol:    make([]*eviction.Locked, len(adapters)),
		layouts:  newLayoutRegistry(),
		evOrder:  make(chan struct{}, 1),
	}
	e.st.adapters = make([]*adapterStats, len(adapters))
	for i := range adapters {
		e.st.adapters[i] = &adapterStats{}
		if ev := cfg.L2[i].Eviction; ev != nil {
			p, _ := eviction.New(ev.Policy)
			// Objects an adapter found at start (fs recover_on_start) count
			// in its usage, so its policy must be able to evict them too.
			if r, ok := adapters[i].(recoverer); ok {
				keys, _ := r.Recovered()
				p.Add(keys)
			}
			e.l2pol[i] = eviction.NewLocked(p)
			adapters[i].AddListener(policyListener{e.l2pol[i]})
		}
	}
	e.store = newStoreCtl(e)
	e.pf = newPrefetchCtl(e)
	return e, nil
}

// Run owns every background goroutine (eviction loops, write-behind,
// prefetch workers). It returns nil when ctx is cancelled, after all of them
// have stopped. Ready reports true while Run is active.
//
// Each goroutine below is owned by this call: it receives ctx, and wg.Wait
// returns only after all of them observed cancellation.
func (e *Engine) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("engine: Run called twice")
	}
	var wg sync.WaitGroup
	e.store.start(ctx, &wg)
	e.pf.start(ctx, &wg)
	e.startEvictionLoops(ctx, &wg)
	e.ready.Store(true)
	e.log.Info("storage engine running", "l1_bytes", e.pool.Size(), "shm", e.pool.Path(), "adapters", len(e.adapters), "eviction_policy", e.cfg.EvictionPolicy)
	<-ctx.Done()
	e.ready.Store(false)
	e.stopped.Store(true)
	wg.Wait()
	e.pf.shutdown()
	if n := e.store.shutdown(); n > 0 {
		e.log.Warn("write-behind uploads pending at shutdown were dropped", "objects", n)
	}
	e.exited.Store(true)
	return nil
}

// Close unmaps the pool and unlinks the shared-memory file. Call it after
// Run has returned; adapters are not closed (their owner closes them).
//
// It refuses while Run has not returned: after its ctx ends, Run still
// waits for uploads and loads that read and write pool memory.
func (e *Engine) Close() error {
	if e.running.Load() && !e.exited.Load() {
		return errors.New("engine: Close while Run is active")
	}
	return e.pool.Close()
}

// Pool describes the L1 pool for the data path's registration reply.
func (e *Engine) Pool() PoolInfo {
	return PoolInfo{Name: e.pool.Name(), Path: e.pool.Path(), Size: e.pool.Size()}
}

// objectSize is the L1 size of key's object per its registered layout.
func (e *Engine) objectSize(k objkey.Key) (int64, error) {
	l, err := e.Layout(k.ModelName, k.WorldSize())
	if err != nil {
		return 0, err
	}
	return l.SizeOf(k.ObjectGroupID), nil
}

// --- L1 data path ---

// mapErr converts l1 errors to the engine's sentinels.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, l1.ErrOutOfMemory):
		return fmt.Errorf("%w: %w", ErrOutOfMemory, err)
	case errors.Is(err, l1.ErrNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, l1.ErrNotReadable):
		return fmt.Errorf("%w: %w", ErrNotReadable, err)
	}
	return fmt.Errorf("%w: %w", ErrInvalid, err)
}

// ReserveWrite (PREPARE_STORE) reserves one private staging slot per key
// that is not already resident, on behalf of writer tag. slots[i] is the
// zero Slot for a key that is resident or already being staged by tag with
// a live lease. All-or-nothing: on ErrOutOfMemory nothing is reserved.
// sizes[i] is the byte size of keys[i].
func (e *Engine) ReserveWrite(tag string, keys []objkey.Key, sizes []int64) ([]Slot, error) {
	if len(sizes) != len(keys) {
		return nil, fmt.Errorf("%w: %d keys but %d sizes", ErrInvalid, len(keys), len(sizes))
	}
	for i, s := range sizes {
		if s <= 0 || s > e.pool.Size() {
			return nil, fmt.Errorf("%w: size of key %d is %d bytes (pool %d)", ErrInvalid, i, s, e.pool.Size())
		}
	}
	ls, err := e.table.Reserve(tag, keys, sizes)
	if errors.Is(err, l1.ErrOutOfMemory) && e.makeRoom(tag, keys, sizes) {
		ls, err = e.table.Reserve(tag, keys, sizes)
	}
	if err != nil {
		if errors.Is(err, l1.ErrOutOfMemory) {
			e.st.allocFailStore.Add(1)
		}
		return nil, mapErr(err)
	}
	return toSlots(ls), nil
}

// makeRoom evicts what a store that did not fit needs (see
// l1.Table.MakeRoom) and reports whether anything was evicted.
func (e *Engine) makeRoom(tag string, keys []objkey.Key, sizes []int64) bool {
	defer e.unlockEvents(e.lockEvents())
	evicted, _ := e.table.MakeRoom(tag, keys, sizes)
	for _, k := range evicted {
		e.st.l1Evicted.add(k.CacheSalt, 1)
	}
	e.deletedL1(evicted)
	return len(evicted) > 0
}

func toSlots(ls []l1.Slot) []Slot {
	out := make([]Slot, len(ls))
	for i, s := range ls {
		out[i] = Slot(s)
	}
	return out
}

// CommitWrite (COMMIT_STORE) publishes tag's staged objects for keys and
// queues them for write-behind to every L2 adapter. Keys tag does not stage
// are skipped; committed reports how many were published (a key that became
// resident meanwhile counts, its staged copy is dropped). An expired
// reservation yields an error wrapping ErrWrongState after the others are
// committed.
func (e *Engine) CommitWrite(tag string, keys []objkey.Key) (int, error) {
	return e.CommitWriteContext(context.Background(), tag, keys)
}

// CommitWriteContext is CommitWrite whose write-behind uploads' spans join
// the trace of ctx's span (the COMMIT_STORE request); ctx is not kept and
// its cancellation does not affect the uploads.
func (e *Engine) CommitWriteContext(ctx context.Context, tag string, keys []objkey.Key) (int, error) {
	var res l1.CommitResult
	e.withEvents(func() {
		res = e.table.Commit(tag, keys, l1.CommitOpts{Pins: len(e.adapters)})
		e.published(res.Published, trace.SpanContextFromContext(ctx))
	})
	if res.Expired > 0 {
		return res.Committed, fmt.Errorf("%w: %d reservations expired before commit", ErrWrongState, res.Expired)
	}
	return res.Committed, nil
}

// published accounts new resident objects, notifies listeners and queues
// write-behind (each handle carries one pin per adapter).
func (e *Engine) published(hs []l1.Handle, sc trace.SpanContext) {
	if len(hs) == 0 {
		return
	}
	keys := make([]objkey.Key, len(hs))
	sizes := make([]int64, len(hs))
	for i, h := range hs {
		keys[i], sizes[i] = h.Key(), h.Slot().Size
	}
	e.st.l1Write.addKeys(keys, 1)
	e.notify(func(l L1Listener) { l.OnL1Stored(keys, sizes) })
	e.store.enqueue(hs, sc)
}

// AbortWrite drops tag's staged objects for keys (a failed transfer).
func (e *Engine) AbortWrite(tag string, keys []objkey.Key) { e.table.Abort(tag, keys) }

// ReadSlots (PREPARE_RETRIEVE) returns the slots of resident keys. Every
// key must be read-locked (by a lookup); otherwise nothing is returned and
// the error wraps ErrNotFound or ErrNotReadable.
func (e *Engine) ReadSlots(keys []objkey.Key) ([]Slot, error) {
	ls, err := e.table.Slots(keys)
	if err != nil {
		if errors.Is(err, l1.ErrNotFound) {
			e.st.readFailNotFound.Add(1)
		}
		return nil, mapErr(err)
	}
	return toSlots(ls), nil
}

// ReleaseRead (COMMIT_RETRIEVE, FREE_LOOKUP_LOCKS) drops up to n read locks
// per key that owner's prefetch job took and still holds; locks owner never
// took, already released or expired are ignored, so over-release is
// impossible. Locks of a key deleted or cleared meanwhile are still found
// (the memory is freed on the last release). It returns the number of
// locks released.
func (e *Engine) ReleaseRead(owner string, keys []objkey.Key, n int) int {
	defer e.unlockEvents(e.lockEvents())
	released, deleted := e.table.Release(owner, keys, n)
	e.deletedL1(deleted)
	return released
}

func (e *Engine) deletedL1(keys []objkey.Key) {
	if len(keys) > 0 {
		e.notify(func(l L1Listener) { l.OnL1Deleted(keys) })
	}
}

// lockEvents takes evOrder when listeners are registered and reports
// whether it did; unlockEvents(lockEvents()) brackets a table call that
// adds or removes resident objects together with the notify reporting it.
// Notified after the table's mutex is released, a store's report could
// otherwise follow the report of a Clear, eviction or delete that removed
// the same key after it, and listeners would be left believing L1 holds a
// key it does not. Listeners must not call back into these methods.
func (e *Engine) lockEvents() bool {
	if !e.hasListeners() {
		return false
	}
	e.evOrder <- struct{}{}
	return true
}

// withEvents runs f, a table change and the notify reporting it, with the
// event order held (lockEvents), and releases it however f ends: a panic
// recovered further up (the periodic loops and the HTTP router recover
// them) must not leave every later L1 change waiting for it.
func (e *Engine) withEvents(f func()) {
	defer e.unlockEvents(e.lockEvents())
	f()
}

// unlockEvents releases what lockEvents took.
func (e *Engine) unlockEvents(locked bool) {
	if locked {
		<-e.evOrder
	}
}

// Touch marks keys as recently used (END_SESSION).
func (e *Engine) Touch(keys []objkey.Key) { e.table.Touch(keys) }

// Clear (CLEAR, POST /cache/clear) removes every L1 object, locked and
// staging ones included. Memory still referenced by a reader, a writer or an
// upload is reclaimed only when that reference ends, so no byte in use is
// overwritten.
func (e *Engine) Clear() ClearResult {
	defer e.unlockEvents(e.lockEvents())
	keys, bytes := e.table.Clear()
	e.deletedL1(keys)
	return ClearResult{Objects: len(keys), Bytes: bytes}
}

// Put stores whole objects by value (POST /api/kv/store): keys already
// resident are skipped. It reserves, copies and commits as one batch and
// returns how many keys were written.
func (e *Engine) Put(keys []objkey.Key, data [][]byte) (int, error) {
	return e.PutContext(context.Background(), keys, data)
}

// PutContext is Put whose write-behind uploads' spans join the trace of
// ctx's span (the HTTP store request); ctx is not kept.
func (e *Engine) PutContext(ctx context.Context, keys []objkey.Key, data [][]byte) (int, error) {
	if len(keys) != len(data) {
		return 0, fmt.Errorf("%w: %d keys but %d payloads", ErrInvalid, len(keys), len(data))
	}
	sizes := make([]int64, len(data))
	for i, d := range data {
		sizes[i] = int64(len(d))
	}
	tag := "api\x00" + strconv.FormatUint(e.seq.Add(1), 10)
	slots, err := e.ReserveWrite(tag, keys, sizes)
	if err != nil {
		return 0, err
	}
	var staged []objkey.Key
	for i, s := range slots {
		if s.Valid() {
			copy(e.Bytes(s), data[i])
			staged = append(staged, keys[i])
		}
	}
	var res l1.CommitResult
	e.withEvents(func() {
		res = e.table.Commit(tag, staged, l1.CommitOpts{Pins: len(e.adapters)})
		e.published(res.Published, trace.SpanContextFromContext(ctx))
	})
	return len(res.Published), nil
}

// Get copies resident objects out (/api/kv/retrieve, checksums). out[i] is
// nil for a key not resident in L1.
func (e *Engine) Get(keys []objkey.Key) ([][]byte, error) {
	owner := "get\x00" + strconv.FormatUint(e.seq.Add(1), 10)
	slots := e.table.ReadLock(owner, keys, 1)
	defer e.ReleaseRead(owner, keys, 1)
	out := make([][]byte, len(keys))
	for i, s := range slots {
		if s.Size > 0 {
			out[i] = append([]byte(nil), e.pool.Bytes(s.Offset, s.Size)...)
		}
	}
	return out, nil
}

// DeleteL1 removes resident keys. Locked keys are skipped unless force.
func (e *Engine) DeleteL1(keys []objkey.Key, force bool) (int, int) {
	defer e.unlockEvents(e.lockEvents())
	deleted, skipped := e.table.Delete(keys, force)
	e.deletedL1(deleted)
	return len(deleted), skipped
}

// --- L2 passthrough ---

func (e *Engine) adapterAt(i int) (l2.Adapter, error) {
	if i < 0 || i >= len(e.adapters) {
		return nil, fmt.Errorf("%w: no L2 adapter at index %d (%d configured)", ErrNotFound, i, len(e.adapters))
	}
	return e.adapters[i], nil
}

// Adapters lists the configured L2 adapters in index order.
func (e *Engine) Adapters() []AdapterInfo {
	out := make([]AdapterInfo, len(e.adapters))
	for i, a := range e.adapters {
		_, rc := a.(Reconfigurer)
		out[i] = AdapterInfo{Index: i, TypeName: a.TypeName(), Shared: e.cfg.L2[i].Shared, Reconfigurable: rc}
	}
	return out
}

// ListL2 pages through adapter index's keys (GET /cache/objects). Errors
// wrap ErrNotFound (bad index) or l2.ErrListUnsupported.
func (e *Engine) ListL2(ctx context.Context, i int, model string, pageSize int, token string) (l2.Page, error) {
	a, err := e.adapterAt(i)
	if err != nil {
		return l2.Page{}, err
	}
	return a.List(ctx, model, pageSize, token)
}

// DeleteL2 deletes keys from adapter index (DELETE /cache/objects) and
// returns those actually removed.
func (e *Engine) DeleteL2(ctx context.Context, i int, keys []objkey.Key) ([]objkey.Key, error) {
	a, err := e.adapterAt(i)
	if err != nil {
		return nil, err
	}
	return a.Delete(ctx, keys)
}

func (e *Engine) reconfigurer(i int) (Reconfigurer, error) {
	a, err := e.adapterAt(i)
	if err != nil {
		return nil, err
	}
	r, ok := a.(Reconfigurer)
	if !ok {
		return nil, fmt.Errorf("%w: adapter %d (%s) is not reconfigurable", ErrUnsupported, i, a.TypeName())
	}
	return r, nil
}

// Reconfigure passes op through to adapter index; ErrUnsupported if it is
// not a Reconfigurer.
func (e *Engine) Reconfigure(ctx context.Context, i int, op string, args map[string]any) (map[string]any, error) {
	r, err := e.reconfigurer(i)
	if err != nil {
		return nil, err
	}
	return r.Reconfigure(ctx, op, args)
}

// ReconfigureStatus is adapter index's ReconfigureStatus.
func (e *Engine) ReconfigureStatus(i int) (map[string]any, error) {
	r, err := e.reconfigurer(i)
	if err != nil {
		return nil, err
	}
	return r.ReconfigureStatus(), nil
}

// QuotaUsage is the usage in bytes of every cache salt as /quota reports
// it: the sum over L2 adapters (upstream counts L2 only). Each adapter's
// usage is read once, so GET /quota costs one copy of each adapter's
// per-salt map, not one per quota.
func (e *Engine) QuotaUsage() map[string]int64 {
	out := map[string]int64{}
	for _, a := range e.adapters {
		for salt, n := range a.Usage().BytesByCacheSalt {
			out[salt] += n
		}
	}
	return out
}

// --- listeners ---

func (e *Engine) hasListeners() bool {
	e.listenMu.RLock()
	defer e.listenMu.RUnlock()
	return len(e.listeners) > 0
}

func (e *Engine) notify(f func(L1Listener)) {
	e.listenMu.RLock()
	ls := e.listeners
	e.listenMu.RUnlock()
	for _, l := range ls {
		f(l)
	}
}

// recoverer is an adapter that found objects at start (fs.Adapter).
type recoverer interface {
	Recovered() ([]objkey.Key, []int64)
}

// policyListener feeds an L2 adapter's events to its eviction policy.
type policyListener struct{ p *eviction.Locked }

func (l policyListener) OnStored(keys []objkey.Key, _ []int64) {
	l.p.Do(func(p eviction.Policy) { p.Add(keys) })
}
func (l policyListener) OnAccessed(keys []objkey.Key) {
	l.p.Do(func(p eviction.Policy) { p.Touch(keys) })
}
func (l policyListener) OnDeleted(keys []objkey.Key) {
	l.p.Do(func(p eviction.Policy) { p.Remove(keys) })
}

// --- status and counters ---

// Status is the storage_manager section of GET /status.
func (e *Engine) Status() map[string]any {
	ts := e.table.Stats()
	ratio := 0.0
	if ts.TotalBytes > 0 {
		ratio = float64(ts.UsedBytes) / float64(ts.TotalBytes)
	}
	running := e.ready.Load()
	l2s := make([]any, len(e.adapters))
	l2ev := make([]any, 0)
	for i, a := range e.adapters {
		l2s[i] = a.Status()
		if ev := e.cfg.L2[i].Eviction; ev != nil {
			u := a.Usage()
			l2ev = append(l2ev, map[string]any{
				"adapter_index": i, "eviction_policy": ev.Policy, "trigger_watermark": ev.TriggerWatermark,
				"eviction_ratio": ev.EvictionRatio, "current_usage": u.Fraction(), "total_bytes_used": u.TotalBytesUsed,
				"total_capacity_bytes": u.TotalCapacityBytes, "num_cache_salt_buckets": len(u.BytesByCacheSalt),
			})
		}
	}
	pending, inflight := e.store.counts()
	return map[string]any{
		"is_healthy": running,
		"l1_manager": map[string]any{
			"is_healthy":              true,
			"total_object_count":      ts.Objects + ts.StagingObjects,
			"write_locked_count":      ts.StagingObjects,
			"read_locked_count":       ts.ReadLocked,
			"temporary_count":         ts.Temporary,
			"staging_object_count":    ts.StagingObjects,
			"staging_bytes":           ts.StagingBytes,
			"memory_used_bytes":       ts.UsedBytes,
			"memory_total_bytes":      ts.TotalBytes,
			"memory_configured_bytes": e.cfg.L1SizeBytes,
			"capacity_bytes_by_backend": map[string]int64{
				"dram": ts.TotalBytes,
			},
			"memory_usage_ratio": ratio,
			"write_ttl_seconds":  e.cfg.L1WriteTTL.Seconds(),
			"read_ttl_seconds":   e.cfg.L1ReadTTL.Seconds(),
			"shm_name":           e.pool.Name(),
		},
		"store_controller": map[string]any{
			"is_healthy": running, "thread_alive": running, "pending_keys_count": pending,
			"in_flight_task_count": inflight, "num_l2_adapters": len(e.adapters),
			"store_policy": e.cfg.L2StorePolicy, "max_attempts": e.cfg.StoreMaxAttempts,
		},
		"prefetch_controller": map[string]any{
			"is_healthy": running, "thread_alive": running, "active_jobs": e.st.activeJobs.Load(),
			"max_in_flight": e.cfg.L2PrefetchMaxInFlight, "prefetch_policy": e.cfg.L2PrefetchPolicy,
		},
		"l1_eviction_controller": map[string]any{
			"is_healthy": running, "thread_alive": running, "eviction_policy": e.cfg.EvictionPolicy,
			"trigger_watermark": e.cfg.EvictionTriggerWatermark, "eviction_ratio": e.cfg.EvictionRatio,
		},
		"l2_eviction_controller": map[string]any{
			"is_healthy": running, "thread_alive": running, "adapters": l2ev,
		},
		"l2_adapters":     l2s,
		"num_l2_adapters": len(e.adapters),
	}
}

// Counters returns a snapshot of every counter and gauge.
func (e *Engine) Counters() Counters {
	ts := e.table.Stats()
	c := Counters{
		L1UsedBytes: ts.UsedBytes, L1TotalBytes: ts.TotalBytes, L1StagingBytes: ts.StagingBytes,
		L1Objects: int64(ts.Objects), L1StagingObjects: int64(ts.StagingObjects), L1ReadLocked: int64(ts.ReadLocked),
		L1Temporary: int64(ts.Temporary), L1PendingUpload: int64(ts.Pinned),
		L1Read: e.st.l1Read.snapshot(), L1Write: e.st.l1Write.snapshot(), L1Evicted: e.st.l1Evicted.snapshot(),
		L1EvictionLoopTicks: e.st.evictTicks.Load(), L1EvictionLoopTriggered: e.st.evictTriggered.Load(),
		L1AllocFailuresStore: e.st.allocFailStore.Load(), L1AllocFailuresPrefetch: e.st.allocFailPrefetch.Load(),
		L1ReadFailuresNotFound: e.st.readFailNotFound.Load(),
		L1ReadLeasesExpired:    ts.ExpiredReads, L1WriteLeasesExpired: ts.ExpiredWrites,
		ActivePrefetchJobs: e.st.activeJobs.Load(), PrefetchRequests: e.st.prefetchRequests.Load(),
		PrefetchHitChunksL1: e.st.hitL1.Load(), PrefetchHitChunksL2: e.st.hitL2.Load(), PrefetchMissChunks: e.st.miss.Load(),
		PrefetchDropped: e.st.prefetchDropped.Load(), PrefetchReaped: e.st.prefetchReaped.Load(), L2LookupTimeouts: e.st.lookupTimeouts.Load(),
		L2LookupUnavailable: e.st.lookupUnavailable.Load(),
		L2PrefetchLookup:    e.st.l2Lookup.Load(), L2PrefetchLookupObj: e.st.l2LookupObj.snapshot(),
		L2PrefetchLoadSub: e.st.l2LoadSub.Load(), L2PrefetchLoadSubObj: e.st.l2LoadSubObj.snapshot(),
		L2PrefetchLoadDone: e.st.l2LoadDone.snapshot(), L2PrefetchFailOOM: e.st.allocFailPrefetch.Load(),
		L2StoreSubmittedObj: e.st.storeSubObj.snapshot(), L2StoreCompletedObj: e.st.storeDoneObj.snapshot(),
		L2EvictedObj: e.st.l2EvictedObj.snapshot(), StoreQueueDropped: e.st.storeDropped.Load(),
	}
	for i, a := range e.adapters {
		s := e.st.adapters[i]
		c.L2 = append(c.L2, L2Counters{
			Index: i, TypeName: a.TypeName(),
			StoreSubmitted: s.storeSubmitted.Load(), StoreCompleted: s.storeCompleted.Load(),
			StoreFailed: s.storeFailed.Load(), StoreRetried: s.storeRetried.Load(), StoreAbandoned: s.storeAbandoned.Load(),
			StoreObjects: s.storeObjects.Load(), StoreBytes: s.storeBytes.Load(),
			LoadCompleted: s.loadCompleted.Load(), LoadObjects: s.loadObjects.Load(), LoadBytes: s.loadBytes.Load(),
			LoadFailed: s.loadFailed.Load(), EvictedObjects: s.evicted.Load(), EvictionTicks: s.evictionTicks.Load(),
			EvictionDeleteFailed: s.evictionDeleteFailed.Load(), InflightStores: s.inflightStores.Load(), InflightLoads: s.inflightLoads.Load(),
			PendingStores: s.pendingStores.Load(), UsageBytes: a.Usage().TotalBytesUsed,
			BreakerState: int64(l2.BreakerStateOf(a)),
		})
	}
	return c
}
