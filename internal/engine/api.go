// Package engine is the storage engine behind `lmcache server`: one L1 tier in
// a (optionally shared-memory) pool, an ordered list of L2 adapters, eviction,
// quotas, write-behind from L1 to L2 and prefetch from L2 into L1.
//
// This file holds the engine's public types, sentinel errors and the
// methods that are one call into a part (table, quotas, prefetch jobs); the
// other exported methods are implemented where their work is (engine.go,
// prefetch.go, layouts.go). The HTTP API and the ZMQ data path code against
// them; each declares its own narrow interface over *Engine, so keep
// signatures stable.
//
// Concurrency: every exported method is safe for concurrent use. Background
// work (eviction loops, write-behind uploads, prefetch jobs) is owned by Run
// and stops when its context is cancelled; Close releases the pool after Run
// has returned.
package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// Sentinel errors. Every error returned by the engine wraps at most one of
// these so the HTTP layer can map statuses in one place.
var (
	// ErrOutOfMemory: an L1 batch allocation could not be satisfied; nothing
	// was allocated.
	ErrOutOfMemory = errors.New("l1: out of memory")
	// ErrNotFound: a key, prefetch job or adapter index does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNotReadable: the key is resident but not read-locked by anyone, so
	// its slot must not be handed out (PREPARE_RETRIEVE without LOOKUP).
	ErrNotReadable = errors.New("object is not read-locked")
	// ErrWrongState: a commit for a reservation whose write lease expired or
	// that was taken over by another writer.
	ErrWrongState = errors.New("object in wrong state")
	// ErrNoLayout: no layout is registered for (model_name, world_size).
	ErrNoLayout = errors.New("no layout registered")
	// ErrInvalid: a malformed request (bad sizes, mismatched lengths, ...).
	ErrInvalid = errors.New("invalid request")
	// ErrUnsupported: the adapter does not implement the operation.
	ErrUnsupported = errors.New("operation not supported")
	// ErrClosed: the engine is closed or its Run context was cancelled.
	ErrClosed = errors.New("engine closed")
)

// Eviction policy names accepted by Config.EvictionPolicy and
// EvictionConfig.Policy (upstream spelling).
const (
	PolicyLRU         = "LRU"
	PolicyIsolatedLRU = "IsolatedLRU"
	PolicyNoop        = "noop"
)

// Store and prefetch policy names (--l2-store-policy, --l2-prefetch-policy).
const (
	StorePolicyDefault    = "default"
	StorePolicySkipL1     = "skip_l1"
	PrefetchPolicyDefault = "default"
	PrefetchPolicyRetain  = "retain"
)

// GiB is the unit of every *-gb flag (upstream means 2^30).
const GiB = 1 << 30

// Config configures New. Zero values take the upstream defaults documented on
// each field, so cmd/lmcache only sets what the user passed.
type Config struct {
	// L1SizeBytes is the pool size: int(--l1-size-gb * 2^30). Required.
	L1SizeBytes int64
	// (--l1-use-lazy and --l1-init-size-gb have no field: the pool is
	// always committed lazily by the kernel on first touch, so the server
	// accepts them and passes nothing on.)
	// L1UseHugepages is --l1-use-hugepages: back the pool with reserved
	// 2 MiB hugetlb pages. Requires ShmName "" and enough free huge pages
	// (checked at New). Without it the pool still asks for transparent
	// huge pages where the kernel allows.
	L1UseHugepages bool
	// L1AlignBytes is --l1-align-bytes (default 4096, a power of two): every
	// slot offset and size is a multiple of it.
	L1AlignBytes int64
	// L1ReadTTL is --l1-read-ttl-seconds (default 300 s): a read lease not
	// renewed within it expires by itself.
	L1ReadTTL time.Duration
	// L1WriteTTL is --l1-write-ttl-seconds (default 600 s): an uncommitted
	// write reservation older than this is reclaimable.
	L1WriteTTL time.Duration

	// ShmName is --shm-name. Empty: anonymous private pool. Otherwise the
	// pool is the POSIX shared-memory file <ShmDir>/lmcache_l1_pool_<name>
	// (prefix added if missing, leading "/" stripped); a stale file of that
	// name is replaced at start and the file is unlinked by Close.
	ShmName string
	// ShmMode is the permission of the shared-memory file (--shm-mode,
	// default 0600).
	ShmMode os.FileMode
	// ShmDir is where POSIX shared memory lives (default /dev/shm; tests
	// point it at a temporary directory).
	ShmDir string

	// EvictionPolicy is --eviction-policy: LRU (default), IsolatedLRU, noop.
	EvictionPolicy string
	// EvictionTriggerWatermark is --eviction-trigger-watermark (default 0.8).
	EvictionTriggerWatermark float64
	// EvictionRatio is --eviction-ratio (default 0.2): the fraction of the
	// tracked keys evicted per triggered cycle.
	EvictionRatio float64
	// EvictionInterval is the eviction loop period (default 1 s; no flag).
	EvictionInterval time.Duration

	// L2StorePolicy is --l2-store-policy: default (keep L1) or skip_l1
	// (drop the L1 copy once every adapter holds the object).
	L2StorePolicy string
	// L2PrefetchPolicy is --l2-prefetch-policy: default (objects loaded for
	// a lookup are temporary) or retain.
	L2PrefetchPolicy string
	// L2PrefetchMaxInFlight is --l2-prefetch-max-in-flight (default 8):
	// prefetch jobs running at once; further jobs queue.
	L2PrefetchMaxInFlight int
	// L2PrefetchLoadTimeout is --l2-prefetch-load-timeout (0 = none): bound
	// on one job's L2 lookup+load.
	L2PrefetchLoadTimeout time.Duration
	// L2LookupTimeout is --l2-lookup-timeout-ms (0 = no budget, upstream's
	// behaviour; the server's default is 200 ms): how long a lookup
	// (Readers > 0, not Sparse) waits for the adapters to say which keys
	// they hold, counted from Prefetch. When it passes, the unanswered
	// adapter calls are cancelled and the job goes on with what it has,
	// usually the L1 prefix (Counters.L2LookupTimeouts); PrefetchResult.Err
	// stays nil, since an answer within the budget is the contract, not a
	// failure. Loads of keys an adapter did report are bounded by
	// L2PrefetchLoadTimeout and the adapter's own timeouts, not by this.
	// Warm prefetches (Sparse) are not bounded by it.
	L2LookupTimeout time.Duration
	// L2 holds per-adapter options, index-aligned with the adapters passed
	// to New (missing entries mean defaults).
	L2 []AdapterConfig

	// StoreMaxAttempts bounds write-behind attempts per (object, adapter)
	// (default 8). After the last failure the upload is abandoned, counted,
	// and the L1 copy becomes evictable again.
	StoreMaxAttempts int
	// Loops is the registry the engine's background loops register in
	// (L1 and L2 eviction, write-behind store workers, prefetch workers),
	// so /periodic-threads lists them and /periodic-threads-health reports
	// one that stops making progress. nil: a private registry.
	Loops *periodic.Registry
	// WorkerLoopInterval is the interval the store and prefetch workers
	// report (default 10 s; no flag): an idle worker completes one cycle
	// per interval, and a worker whose cycle (one upload batch, one
	// prefetch job) has not returned within three intervals is unhealthy.
	WorkerLoopInterval time.Duration

	// StoreRetryBase and StoreRetryMax shape the exponential retry backoff
	// (defaults 100 ms and 30 s).
	StoreRetryBase time.Duration
	StoreRetryMax  time.Duration
}

// AdapterConfig holds the engine-side options of one --l2-adapter JSON.
type AdapterConfig struct {
	// Eviction is the adapter's "eviction" block; nil disables L2 eviction.
	Eviction *EvictionConfig
	// Shared is the adapter's "shared" flag (reported, not acted upon).
	Shared bool
}

// EvictionConfig is an L2 adapter's "eviction" block, as parsed by package
// l2 (zero fields take upstream's defaults: LRU, 0.8, 0.2).
type EvictionConfig = l2.EvictionConfig

// Slot is a byte range of the L1 pool: what the data path hands to vLLM
// workers as (offset, length) into the shared-memory file.
type Slot struct {
	Offset int64
	Size   int64
}

// Valid reports whether the slot refers to pool memory (a zero Slot marks a
// key that needs no transfer).
func (s Slot) Valid() bool { return s.Size > 0 }

// PoolInfo describes the L1 pool for vLLM workers.
type PoolInfo struct {
	// Name is the POSIX shm name without a leading "/" (e.g.
	// "lmcache_l1_pool_a"), "" when the pool is not shared.
	Name string
	// Path is the file backing the pool ("" when not shared).
	Path string
	// Size is the pool size in bytes (the file is already this long).
	Size int64
}

// Layout is a registered model layout: how big one chunk's object is for a
// (model_name, world_size) pair. Needed to size L1 buffers for L2 loads.
type Layout struct {
	ModelName string
	WorldSize int
	// ObjectBytes is the size of one chunk object of one rank.
	ObjectBytes int64
	// GroupObjectBytes optionally overrides ObjectBytes per object group id.
	GroupObjectBytes []int64
	// Meta is opaque data reported by Status (the data path's KV layout).
	Meta map[string]any
}

// SizeOf returns the object size for an object group.
func (l Layout) SizeOf(group int64) int64 {
	if group >= 0 && group < int64(len(l.GroupObjectBytes)) && l.GroupObjectBytes[group] > 0 {
		return l.GroupObjectBytes[group]
	}
	return l.ObjectBytes
}

// PrefetchRequest starts a lookup/prefetch job (LOOKUP or HTTP warm
// prefetch).
type PrefetchRequest struct {
	// ID identifies the job (vLLM request id, or a generated uuid for warm
	// prefetch). A new job with the ID of an unconsumed one replaces it.
	ID string
	// Chunks are the keys per chunk (all ranks and groups of that chunk),
	// in token order.
	Chunks [][]objkey.Key
	// Readers is the number of read locks taken per object of the hit
	// prefix (num_kv_readers). 0 = warm prefetch: nothing stays locked.
	Readers int
	// Sparse loads every missing chunk (warm prefetch). Otherwise only the
	// run after the leading L1 hits is considered and the result is the
	// leading run of complete chunks (LOOKUP).
	Sparse bool
	// Retain keeps objects loaded from L2 resident after the last reader
	// leaves; otherwise they are temporary (Config.L2PrefetchPolicy retain
	// forces this on).
	Retain bool
	// Trace is the request span that asked (a LOOKUP, an HTTP route); the
	// job's L2 spans are its children. The zero value: none.
	Trace trace.SpanContext
}

// PrefetchResult is the outcome of a prefetch job.
type PrefetchResult struct {
	// Done is false while the job runs.
	Done bool
	// LookupDone is true once every tier has answered which keys it holds
	// (before L2 loads finish); LookupPrefixChunks is then the leading run
	// of chunks complete in L1 or some adapter (QUERY_PREFETCH_LOOKUP_HITS).
	LookupDone         bool
	LookupPrefixChunks int
	// PrefixChunks is the leading run of chunks whose every key is resident
	// (and, with Readers > 0, read-locked on behalf of the job's ID).
	PrefixChunks int
	// TotalKeys is the number of keys requested.
	TotalKeys int
	// L1Keys were already resident; L2Keys were loaded from L2 by this job.
	L1Keys int
	L2Keys int
	// Err is the first L2 or allocation error the job met (an adapter
	// failing its lookup or load, the load timeout, an L1 out-of-memory for
	// the loads). It is informational: the other fields stay valid, the
	// job is done, and the prefix's read locks are held as usual and must
	// be released as usual. Failures are also counted in Counters.
	Err error
	// Duration is the time from Prefetch to the job's completion (set when
	// Done; lmcache_mp_lookup_duration_seconds).
	Duration time.Duration
}

// AdapterInfo describes one configured L2 adapter.
type AdapterInfo struct {
	Index    int
	TypeName string
	Shared   bool
	// Reconfigurable: the adapter implements Reconfigurer.
	Reconfigurable bool
}

// Reconfigurer is implemented by adapters that support runtime
// reconfiguration (DAX). The engine passes calls through unchanged.
type Reconfigurer interface {
	// Reconfigure applies op ("add", "remove", "resize", ...) with args.
	Reconfigure(ctx context.Context, op string, args map[string]any) (map[string]any, error)
	// ReconfigureStatus reports the adapter's reconfigurable state.
	ReconfigureStatus() map[string]any
}

// L1Listener observes L1 events (coordinator event reporting). Calls are
// made synchronously outside the L1 table's lock, one at a time and in the
// order the table made the changes; they must not block, nor call engine
// methods that store, release, delete, clear or evict.
type L1Listener interface {
	// OnL1Stored: objects were committed (by a store or an L2 load).
	OnL1Stored(keys []objkey.Key, sizes []int64)
	// OnL1Accessed: objects were read-locked by a lookup.
	OnL1Accessed(keys []objkey.Key)
	// OnL1Deleted: objects left L1 (eviction, delete, clear).
	OnL1Deleted(keys []objkey.Key)
}

// ClearResult reports what Clear removed.
type ClearResult struct {
	Objects int
	Bytes   int64
}

// Leaks lists the references the L1 table still holds (read leases, pins
// of unsettled uploads, staged writes), one line per object naming its key.
// After Run returned and every client released what it took, it is empty;
// tests call it before Close so that a leaked lease fails the test by name.
func (e *Engine) Leaks() []string { return e.table.Leaks() }

// ErrLeaked is wrapped by CloseChecked's error when references were left.
var ErrLeaked = errors.New("engine references leaked at close")

// CloseChecked is Close with pebble's leak check: it lists Leaks first and
// returns, joined with Close's own error, one wrapping ErrLeaked that names
// every object still referenced. Tests close their engines with it, so a
// lease, pin or staged write a code path forgot to release fails the test
// by key. The binary uses Close: at shutdown a worker's unreleased lookup
// lease is legitimate (it would expire with its TTL).
func (e *Engine) CloseChecked() error {
	leaks := e.Leaks()
	err := e.Close()
	if len(leaks) > 0 {
		err = errors.Join(err, fmt.Errorf("%w: %d:\n%s", ErrLeaked, len(leaks), strings.Join(leaks, "\n")))
	}
	return err
}

// Ready reports whether Run is serving (readiness probe).
func (e *Engine) Ready() bool { return e.ready.Load() }

// Bytes returns the pool memory of a slot. The slice aliases the pool: it is
// valid only while the caller holds the write reservation or a read lock
// that produced the slot. It panics on a slot outside the pool.
func (e *Engine) Bytes(s Slot) []byte { return e.pool.Bytes(s.Offset, s.Size) }

// PollPrefetch returns the job's state. A done result is returned exactly
// once: the job is forgotten and the next poll returns ErrNotFound.
func (e *Engine) PollPrefetch(id string) (PrefetchResult, error) { return e.pf.jobState(id, true) }

// PeekPrefetch is PollPrefetch without consuming a done job
// (QUERY_PREFETCH_LOOKUP_HITS must not consume it).
func (e *Engine) PeekPrefetch(id string) (PrefetchResult, error) { return e.pf.jobState(id, false) }

// SetQuota sets cache_salt's limit in bytes (negative → ErrInvalid). The
// HTTP "_default" sentinel must already be mapped to "" (see quota.FromPath).
func (e *Engine) SetQuota(salt string, limitBytes int64) error {
	if err := e.quotas.Set(salt, limitBytes); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// DeleteQuota removes salt's limit and reports whether it existed.
func (e *Engine) DeleteQuota(salt string) bool { return e.quotas.Delete(salt) }

// Quota returns salt's limit (0 when unregistered) and whether it exists.
func (e *Engine) Quota(salt string) (limitBytes int64, exists bool) { return e.quotas.Get(salt) }

// Quotas lists the registered limits.
func (e *Engine) Quotas() map[string]int64 { return e.quotas.List() }

// AddL2Listener attaches l to every adapter (coordinator event reporting).
func (e *Engine) AddL2Listener(l l2.Listener) {
	for _, a := range e.adapters {
		a.AddListener(l)
	}
}

// AddL1Listener registers l for L1 events. Register before Run.
func (e *Engine) AddL1Listener(l L1Listener) {
	e.listenMu.Lock()
	e.listeners = append(e.listeners, l)
	e.listenMu.Unlock()
}
