// Package stats holds the snapshot of the storage engine's counters and
// gauges. The engine fills it and mpmetrics renders it; it lives apart from
// both so that mpmetrics (and everything that links mpmetrics, such as the
// coordinator client) does not link the engine.
package stats

// Counters is a point-in-time snapshot of the engine's counters (monotonic,
// "Total" in Prometheus terms) and gauges. Per-salt maps are keyed by
// cache_salt ("" for unsalted). The metrics endpoint renders them under
// upstream's names (research mp_server.md section 6); the comment on each
// field names the upstream instrument it feeds.
type Counters struct {
	// L1 gauges.
	L1UsedBytes      int64 // l1_memory_usage_bytes
	L1TotalBytes     int64 // l1_usage_ratio = used/total
	L1StagingBytes   int64 // l1_staging_bytes
	L1Objects        int64 // resident objects
	L1StagingObjects int64
	L1ReadLocked     int64
	L1Temporary      int64
	L1PendingUpload  int64 // resident objects with a write-behind upload outstanding

	// L1 counters (chunks).
	L1Read    map[string]int64 // l1_read{cache_salt}: objects read-locked
	L1Write   map[string]int64 // l1_write{cache_salt}: objects committed
	L1Evicted map[string]int64 // l1_evicted{cache_salt}

	L1EvictionLoopTicks     int64 // l1_eviction_loop_ticks
	L1EvictionLoopTriggered int64 // l1_eviction_loop_triggered

	// health: l1_allocation_failure{during}.
	L1AllocFailuresStore    int64 // during=l1_store
	L1AllocFailuresPrefetch int64 // during=l2_prefetch
	// health: l1_read_failure{reason=not_found} during l1_retrieve.
	L1ReadFailuresNotFound int64
	// Leases that expired (a crashed or slow client): read and write.
	L1ReadLeasesExpired  int64
	L1WriteLeasesExpired int64

	// Prefetch jobs.
	ActivePrefetchJobs  int64 // active_prefetch_jobs gauge
	PrefetchRequests    int64 // prefetch_requests
	PrefetchHitChunksL1 int64 // prefetch_hit_chunks{tier=l1}
	PrefetchHitChunksL2 int64 // prefetch_hit_chunks{tier=l2}
	PrefetchMissChunks  int64 // prefetch_miss_chunks
	// PrefetchDropped counts jobs whose L2 phase never ran because the job
	// queue was full (they complete with the L1 result only);
	// PrefetchReaped counts finished jobs nobody polled within
	// the engine's prefetch result TTL, discarded to bound memory.
	PrefetchDropped int64
	PrefetchReaped  int64
	// L2LookupTimeouts counts lookup jobs whose L2 lookup ran out of the
	// engine.Config.L2LookupTimeout budget and answered without (some of) the
	// adapters (l2_prefetch_failure{reason=lookup_timeout}).
	L2LookupTimeouts int64
	// L2LookupUnavailable counts adapter lookups skipped because the
	// adapter was unavailable (circuit-broken or closed); the job answers
	// from the other tiers without an error
	// (l2_prefetch_failure{reason=adapter_unavailable}).
	L2LookupUnavailable  int64
	L2PrefetchLookup     int64            // l2_prefetch_lookup (requests sent to L2)
	L2PrefetchLookupObj  map[string]int64 // l2_prefetch_lookup_objects{cache_salt}
	L2PrefetchLoadSub    int64            // l2_prefetch_load_submitted
	L2PrefetchLoadSubObj map[string]int64 // l2_prefetch_load_submitted_objects{cache_salt}
	L2PrefetchLoadDone   map[string]int64 // l2_prefetch_load_completed{cache_salt}
	L2PrefetchFailOOM    int64            // health l2_prefetch_failure{reason=l1_oom}; equals L1AllocFailuresPrefetch

	// Write-behind, per salt (all adapters together).
	L2StoreSubmittedObj map[string]int64 // l2_store_submitted_objects{cache_salt}
	L2StoreCompletedObj map[string]int64 // l2_store_completed_objects{cache_salt}
	L2EvictedObj        map[string]int64 // l2_evicted_objects{cache_salt}
	// StoreQueueDropped counts objects whose write-behind uploads were
	// still queued or backing off when engine.Run returned (or that were committed
	// after it returned): they are unpinned and never uploaded.
	StoreQueueDropped int64

	// L2 holds one entry per adapter, in index order.
	L2 []L2Counters
}

// L2Counters are one adapter's counters ({l2_name} labels upstream).
type L2Counters struct {
	Index    int
	TypeName string

	StoreSubmitted int64 // l2_store_submitted (tasks)
	StoreCompleted int64 // l2_store_completed (successful tasks)
	StoreFailed    int64 // failed attempts (each retry counts)
	StoreRetried   int64 // attempts after the first
	StoreAbandoned int64 // objects given up on after engine.Config.StoreMaxAttempts
	StoreObjects   int64 // objects uploaded
	StoreBytes     int64
	LoadCompleted  int64 // l2_load_completed (tasks)
	LoadObjects    int64
	LoadBytes      int64
	LoadFailed     int64
	EvictedObjects int64
	EvictionTicks  int64
	// EvictionDeleteFailed counts eviction cycles whose Delete call on
	// this adapter failed: the victims stay on the tier (a Go addition).
	EvictionDeleteFailed int64

	InflightStores int64 // num_inflight_l2_stores
	InflightLoads  int64 // num_inflight_l2_loads
	PendingStores  int64 // objects queued or backing off for this adapter
	UsageBytes     int64 // l2_usage_bytes
	// BreakerState is l2.BreakerStateOf the adapter (l2_breaker_state):
	// 0 closed, 1 open, 2 half-open; 0 for adapters without a breaker.
	BreakerState int64
}
