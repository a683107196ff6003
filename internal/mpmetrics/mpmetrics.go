// Package mpmetrics renders the MP server's Prometheus metrics under
// upstream's names (research mp_server.md section 6) on a private registry.
//
// Engine counters live in the engine as atomics; this package reads a
// snapshot at scrape time (a custom Collector) instead of double-counting.
// POST /metrics/reset cannot zero the engine's atomics, so Reset records the
// current snapshot as a baseline and later scrapes report counters relative
// to it; gauges are live state and are never reset.
package mpmetrics

import (
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
	"github.com/lmcache-go/lmcache/internal/mpmetrics/stats"
)

// Namespace prefixes every LMCache metric, as upstream's "lmcache_mp." meter
// after the OTel→Prometheus translation.
const Namespace = "lmcache_mp"

// Source returns the engine's counters; nil (or a nil func) means no engine
// yet, and only the metrics this package owns are exported.
type Source func() stats.Counters

// Metrics owns the private registry.
type Metrics struct {
	reg *prometheus.Registry

	// Lookup counters fed by whoever serves lookups (the ZMQ data path and
	// POST /api/kv/lookup), labelled {model_name, cache_salt}, in tokens
	// unless the name says keys.
	LookupRequestedTokens *prometheus.CounterVec
	LookupHitTokens       *prometheus.CounterVec
	LookupHitL1Tokens     *prometheus.CounterVec
	LookupHitL2Tokens     *prometheus.CounterVec
	LookupHitL1Keys       *prometheus.CounterVec
	LookupHitL2Keys       *prometheus.CounterVec
	Lookups               *prometheus.CounterVec
	LookupEarlyExit       *prometheus.CounterVec
	// LookupSeconds is the time lookups took from submission to the
	// engine's answer (a Go addition; RecordLookup observes it). It has no
	// labels; a vector only so that Reset can empty it.
	LookupSeconds *prometheus.HistogramVec

	// Coordinator event reporting (no upstream equivalent; Go additions).
	CoordEventsQueued  *Counter
	CoordEventsDropped *Counter
	CoordBatchesSent   *Counter
	CoordBatchesFailed *Counter
	CoordRegistrations *Counter

	// ZMQ data path: work it dropped (Go additions, docs/compatibility.md
	// "Data path"). Refused is labelled {reason}: control_queue_full,
	// transfer_queue_full, wrong_wire_profile; DroppedReplies {reason}:
	// peer_gone, peer_not_reading, send_failed, handoff_failed; Malformed
	// {kind}: frames, op_frame, unknown_op, payload_count, payload,
	// receive_failed (the ROUTER socket's receive failed: a message lost).
	ZMQRefused             *prometheus.CounterVec
	ZMQDroppedReplies      *prometheus.CounterVec
	ZMQMalformed           *prometheus.CounterVec
	ZMQReapedWorkers       *Counter
	ZMQAbandonedTransfers  *Counter
	ZMQProfileRefusedPeers *Counter
	// ZMQEvictedSessions counts request sessions dropped because more
	// than mq.Config.MaxSessions were open (the least recently used goes).
	ZMQEvictedSessions *Counter
	// ZMQDroppedRecords counts per-request records dropped past their
	// bound, by {kind}: no_job (a LOOKUP that started no job), lookup
	// (a running lookup's metrics metadata: that lookup goes uncounted).
	ZMQDroppedRecords *prometheus.CounterVec
	// ZMQBusyPollSeconds is the time the socket goroutine spent polling
	// without blocking (--zmq-busy-poll-us): CPU spent to save wake-ups.
	ZMQBusyPollSeconds *Counter

	// KV bytes and chunks moved between workers and L1 (Go additions), by
	// {direction}: store, retrieve and {path}: engine_driven (the worker
	// copies; counted at COMMIT_STORE and COMMIT_RETRIEVE),
	// lmcache_driven_cpu, lmcache_driven_cuda (the server copies; counted
	// when the copy completed). TransferCopySeconds is the time those
	// server-side copies took (CUDA: submission to completion), so
	// bytes / seconds is the copy rate.
	TransferBytes       *prometheus.CounterVec
	TransferChunks      *prometheus.CounterVec
	TransferCopySeconds *prometheus.CounterVec
	// TransferCommitWaits counts LOOKUPs and RETRIEVEs ({op}: lookup,
	// retrieve) that found chunks of an answered lmcache-driven CUDA
	// STORE not yet committed and waited, by {outcome}: committed,
	// deadline (went on without them), shutdown, not_waited (a LOOKUP
	// on the socket goroutine, which never waits).
	TransferCommitWaits *prometheus.CounterVec

	// KV events for KV-aware routers (internal/kvevents). KVEventsDropped
	// counts events, labelled {reason}: unbound_store, salted,
	// publisher_queue_full, log_overflow, publish_failed.
	// KVEventsReplayRequestsFailed counts replay requests, not events, so
	// it is a counter of its own, labelled {reason}: invalid (malformed,
	// answered with nothing), aborted (cut short by a failed send).
	KVEventsDropped              *prometheus.CounterVec
	KVEventsReplayRequestsFailed *prometheus.CounterVec

	// TraceSpansDropped counts spans the OTLP exporter lost, by {reason}.
	TraceSpansDropped *prometheus.CounterVec

	vecs     []interface{ Reset() }
	resets   []*Counter
	engine   *engineCollector
	instance string
}

// New builds the registry. instanceID is reported on target_info as
// service_instance_id (upstream's OTel resource attribute).
func New(instanceID string, src Source) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), instance: instanceID}
	lookupLabels := []string{"model_name", "cache_salt"}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		m.reg.MustRegister(v)
		m.vecs = append(m.vecs, v)
		return v
	}
	m.LookupRequestedTokens = cv(Namespace+"_lookup_requested_tokens_total", "Chunk-aligned tokens asked for by lookups.", lookupLabels...)
	m.LookupHitTokens = cv(Namespace+"_lookup_hit_tokens_total", "Tokens of the hit prefix.", lookupLabels...)
	m.LookupHitL1Tokens = cv(Namespace+"_lookup_hit_l1_tokens_total", "Hit-prefix tokens served from L1.", lookupLabels...)
	m.LookupHitL2Tokens = cv(Namespace+"_lookup_hit_l2_tokens_total", "Hit-prefix tokens loaded from L2.", lookupLabels...)
	m.LookupHitL1Keys = cv(Namespace+"_lookup_hit_l1_keys_total", "Hit-prefix keys served from L1.", lookupLabels...)
	m.LookupHitL2Keys = cv(Namespace+"_lookup_hit_l2_keys_total", "Hit-prefix keys loaded from L2.", lookupLabels...)
	m.Lookups = cv(Namespace+"_lookups_requests_total", "Lookup requests.", lookupLabels...)
	m.LookupEarlyExit = cv(Namespace+"_lookup_early_exit_requests_total", "Lookups answered without touching storage.", "model_name", "cache_salt", "reason")

	lookupHist := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: Namespace + "_lookup_duration_seconds",
		Help:    "Time from a lookup's submission (ZMQ LOOKUP, POST /api/kv lookup) to the engine's answer, L2 lookups and loads included.",
		Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}}, nil)
	m.reg.MustRegister(lookupHist)
	m.LookupSeconds = lookupHist
	lookupHist.WithLabelValues() // exported (empty) before the first lookup

	c := func(name, help string) *Counter {
		rc := &Counter{desc: prometheus.NewDesc(name, help, nil, nil)}
		m.reg.MustRegister(rc)
		m.resets = append(m.resets, rc)
		return rc
	}
	m.CoordEventsQueued = c(Namespace+"_coordinator_events_queued_total", "L2 events queued for the coordinator.")
	m.CoordEventsDropped = c(Namespace+"_coordinator_events_dropped_total", "L2 events dropped: the reporting queue was full, a failed batch had no room to be requeued, the coordinator answered the batch stale, it refused the event itself (a 4xx such as 422), or the event was still undelivered when the server stopped.")
	m.CoordBatchesSent = c(Namespace+"_coordinator_batches_sent_total", "Event batches the coordinator accepted.")
	m.CoordBatchesFailed = c(Namespace+"_coordinator_batches_failed_total", "Event batches that failed to reach the coordinator.")
	m.CoordRegistrations = c(Namespace+"_coordinator_registrations_total", "Successful (re-)registrations with the coordinator.")
	m.ZMQRefused = cv(Namespace+"_zmq_refused_requests_total", "ZMQ requests refused without being executed (answered with their negative reply, or not at all for a refused peer).", "reason")
	m.ZMQDroppedReplies = cv(Namespace+"_zmq_dropped_replies_total", "ZMQ replies that never reached their client.", "reason")
	m.ZMQMalformed = cv(Namespace+"_zmq_malformed_messages_total", "ZMQ messages that could not be parsed as a request, or were lost to a failed ROUTER receive (kind receive_failed).", "kind")
	m.ZMQBusyPollSeconds = c(Namespace+"_zmq_busy_poll_seconds_total", "Time the ZMQ socket goroutine spent polling without blocking after a message (--zmq-busy-poll-us), CPU spent to answer the next request without a wake-up.")
	m.ZMQReapedWorkers = c(Namespace+"_zmq_reaped_workers_total", "Worker registrations dropped by the reaper after going silent.")
	m.ZMQAbandonedTransfers = c(Namespace+"_zmq_abandoned_transfers_total", "PREPARE_STORE/PREPARE_RETRIEVE whose COMMIT never came, dropped (staged writes aborted, read locks released): by the reaper, or still open when the data path stopped.")
	m.ZMQDroppedRecords = cv(Namespace+"_zmq_dropped_request_records_total", "Per-request records the data path dropped because 65,536 were kept (a client sending new request ids and never polling), by kind: no_job (the id of a LOOKUP that started no job; its next poll asks the engine), lookup (a running lookup's metadata; that lookup is not counted in the lookup metrics).", "kind")
	m.ZMQEvictedSessions = c(Namespace+"_zmq_evicted_sessions_total", "Request sessions (a request's cached chunk hashes) dropped, least recently used first, because more were open than the data path keeps; the request's next message hashes its prompt again.")
	m.ZMQProfileRefusedPeers = c(Namespace+"_zmq_wire_profile_refused_peers_total", "Client connections refused because their first request fingerprints a wire profile other than the forced --wire-profile.")

	m.TransferBytes = cv(Namespace+"_transfer_bytes_total", "KV cache bytes moved between workers and L1, by direction (store, retrieve) and path (engine_driven: the worker copies; lmcache_driven_cpu, lmcache_driven_cuda: the server copies).", "direction", "path")
	m.TransferChunks = cv(Namespace+"_transfer_chunks_total", "KV cache chunk objects moved between workers and L1, by direction and path (as lmcache_mp_transfer_bytes_total).", "direction", "path")
	m.TransferCommitWaits = cv(Namespace+"_transfer_commit_waits_total", "LOOKUPs and RETRIEVEs that waited for the commit of an answered lmcache-driven CUDA STORE of their chunks, by op (lookup, retrieve) and outcome (committed; deadline: went on without them; shutdown; not_waited: a LOOKUP answered on the socket goroutine, which never blocks, because the store began after it was handed there).", "op", "outcome")
	m.TransferCopySeconds = cv(Namespace+"_transfer_copy_seconds_total", "Time the server spent copying KV cache on the lmcache-driven path (CUDA: from submission to completion), by direction and path.", "direction", "path")

	m.KVEventsDropped = cv(Namespace+"_kv_events_dropped_total", "KV events for KV-aware routers that were not published or not kept: stored chunks without known tokens (unbound_store), salted chunks (salted), events the publisher queue had no room for (publisher_queue_full), the oldest POLL_KV_EVENTS records the full log discarded to make room (log_overflow; a poller that had not read them is told lost), events of batches the PUB socket refused (kept for replay) or the stopping or stopped publisher could not send (publish_failed). Failed replay requests are counted in lmcache_mp_kv_events_replay_requests_failed_total.", "reason")
	m.KVEventsReplayRequestsFailed = cv(Namespace+"_kv_events_replay_requests_failed_total", "KV events replay requests (--kv-events-replay-endpoint) not answered in full, one per request: malformed requests, ignored and answered with nothing (invalid); replays cut short by a failed send, the client getting neither the remaining batches nor the end marker (aborted).", "reason")

	m.engine = &engineCollector{src: src}
	m.reg.MustRegister(m.engine)
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ti := prometheus.NewGauge(prometheus.GaugeOpts{Name: "target_info", Help: "Target metadata.",
		ConstLabels: prometheus.Labels{"service_name": "lmcache-mp", "service_instance_id": instanceID}})
	ti.Set(1)
	m.reg.MustRegister(ti)
	// Build identity (a Go addition): version and revision from the
	// stamped values or, when unstamped, the Go build information.
	bi := prometheus.NewGauge(prometheus.GaugeOpts{Name: Namespace + "_build_info", Help: "Build of this lmcache server (value 1).",
		ConstLabels: buildinfo.Labels()})
	bi.Set(1)
	m.reg.MustRegister(bi)
	m.TraceSpansDropped = cv(Namespace+"_trace_spans_dropped_total", "OpenTelemetry spans lost (--enable-tracing), by reason: export_failed (the OTLP collector refused them or could not be reached), queue_full (2048 spans, or OTEL_BSP_MAX_QUEUE_SIZE, were already waiting for export), shutdown (the span ended after tracing shutdown had begun, too late to be exported).", "reason")
	// The reasons exist at 0, so a dashboard sees the series before the
	// first loss.
	m.TraceSpansDropped.WithLabelValues("export_failed")
	m.TraceSpansDropped.WithLabelValues("queue_full")
	m.TraceSpansDropped.WithLabelValues("shutdown")
	return m
}

// KVEventsDrop adds n dropped events under reason to
// lmcache_mp_kv_events_dropped_total; it is kvevents.Config.Dropped.
func (m *Metrics) KVEventsDrop(reason string, n int) {
	m.KVEventsDropped.WithLabelValues(reason).Add(float64(n))
}

// KVEventsReplayFailed counts one replay request not answered in full
// under reason in lmcache_mp_kv_events_replay_requests_failed_total; it is
// kvevents.Config.ReplayFailed.
func (m *Metrics) KVEventsReplayFailed(reason string) {
	m.KVEventsReplayRequestsFailed.WithLabelValues(reason).Inc()
}

// SetSource replaces the engine counter source (when the engine becomes ready).
func (m *Metrics) SetSource(src Source) { m.engine.setSource(src) }

// Registry is the private registry (for tests and extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Reset zeroes every counter this package owns and rebases the engine's
// counters on their current values (POST /metrics/reset).
func (m *Metrics) Reset() {
	for _, v := range m.vecs {
		v.Reset()
	}
	for _, c := range m.resets {
		c.reset()
	}
	m.LookupSeconds.Reset()
	m.LookupSeconds.WithLabelValues()
	m.engine.rebase()
}

// Counter is a counter that can go back to zero, which prometheus.Counter
// cannot. It is safe for concurrent use.
type Counter struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	v    float64
}

// Inc adds one.
func (c *Counter) Inc() { c.Add(1) }

// Add adds f, which must not be negative.
func (c *Counter) Add(f float64) {
	if f < 0 {
		panic("counter cannot decrease")
	}
	c.mu.Lock()
	c.v += f
	c.mu.Unlock()
}
func (c *Counter) reset() {
	c.mu.Lock()
	c.v = 0
	c.mu.Unlock()
}

// Value is the current value.
func (c *Counter) Value() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v
}
func (c *Counter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *Counter) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, c.Value())
}

// engineCollector exports stats.Counters snapshots of the engine.
type engineCollector struct {
	mu   sync.Mutex
	src  Source
	base *stats.Counters
}

func (e *engineCollector) setSource(s Source) {
	e.mu.Lock()
	e.src = s
	e.base = nil
	e.mu.Unlock()
}

func (e *engineCollector) rebase() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.src == nil {
		return
	}
	c := e.src()
	e.base = &c
}

// Describe sends nothing: the collector is unchecked because the label
// values (salts, adapters) are only known at scrape time.
func (e *engineCollector) Describe(chan<- *prometheus.Desc) {}

type desc struct {
	name, help string
	labels     []string
}

var (
	dL1Used       = desc{"l1_memory_usage_bytes", "L1 bytes in use.", nil}
	dL1Ratio      = desc{"l1_usage_ratio", "L1 used/total (0 when total is 0).", nil}
	dL1Staging    = desc{"l1_staging_bytes", "L1 bytes held by uncommitted writes.", nil}
	dL1Read       = desc{"l1_read_chunks_total", "L1 objects read-locked.", []string{"cache_salt"}}
	dL1Write      = desc{"l1_write_chunks_total", "L1 objects committed.", []string{"cache_salt"}}
	dL1Evicted    = desc{"l1_evicted_chunks_total", "L1 objects evicted.", []string{"cache_salt"}}
	dTicks        = desc{"l1_eviction_loop_ticks_total", "L1 eviction loop cycles.", nil}
	dTriggered    = desc{"l1_eviction_loop_triggered_total", "L1 eviction cycles that evicted.", nil}
	dAllocFail    = desc{"l1_allocation_failure_total", "L1 allocation failures.", []string{"during"}}
	dReadFail     = desc{"l1_read_failure_total", "L1 read failures.", []string{"during", "reason"}}
	dPrefFail     = desc{"l2_prefetch_failure_total", "L2 prefetch failures.", []string{"reason"}}
	dActiveJobs   = desc{"active_prefetch_jobs", "Prefetch jobs in flight.", nil}
	dPrefReq      = desc{"prefetch_requests_total", "Prefetch jobs submitted.", nil}
	dPrefHit      = desc{"prefetch_hit_chunks_total", "Prefetched chunks found, by tier.", []string{"tier"}}
	dPrefMiss     = desc{"prefetch_miss_chunks_total", "Prefetched chunks not found.", nil}
	dL2Lookup     = desc{"l2_prefetch_lookup_requests_total", "Lookup requests sent to L2.", nil}
	dL2LookupObj  = desc{"l2_prefetch_lookup_objects_chunks_total", "Objects looked up in L2.", []string{"cache_salt"}}
	dL2LoadSub    = desc{"l2_prefetch_load_submitted_requests_total", "L2 load requests submitted.", nil}
	dL2LoadSubObj = desc{"l2_prefetch_load_submitted_objects_chunks_total", "Objects submitted for L2 load.", []string{"cache_salt"}}
	dL2LoadDone   = desc{"l2_prefetch_load_completed_chunks_total", "Objects loaded from L2.", []string{"cache_salt"}}
	dStoreSubObj  = desc{"l2_store_submitted_objects_chunks_total", "Objects submitted for L2 store.", []string{"cache_salt"}}
	dStoreDoneObj = desc{"l2_store_completed_objects_chunks_total", "Objects stored to L2.", []string{"cache_salt"}}
	dL2EvictedObj = desc{"l2_evicted_objects_chunks_total", "Objects evicted from L2.", []string{"cache_salt"}}
	dStoreSub     = desc{"l2_store_submitted_requests_total", "L2 store tasks submitted.", []string{"l2_name"}}
	dStoreDone    = desc{"l2_store_completed_requests_total", "L2 store tasks completed.", []string{"l2_name"}}
	dLoadDone     = desc{"l2_load_completed_requests_total", "L2 load tasks completed.", []string{"l2_name"}}
	// A Go addition: upstream only logs a failed eviction delete.
	dEvictDelFail = desc{"l2_eviction_delete_failures_total", "L2 eviction cycles whose Delete call on the adapter failed (the victims stay on the tier and are retried next cycle).", []string{"l2_name"}}
	dL2Usage      = desc{"l2_usage_bytes", "L2 bytes in use.", []string{"l2_name"}}
	// Dropped work the engine counts (Go additions; upstream only logs or
	// does not bound these).
	dPrefDropped    = desc{"prefetch_dropped_jobs_total", "Prefetch work dropped, by reason: queue_full (the L2 job queue was full: the job answered with its L1 hits only), unpolled (a finished job nobody polled, discarded after 10 minutes, or the oldest waiting one once 65,536 were).", []string{"reason"}}
	dStoreAbandoned = desc{"l2_store_abandoned_objects_total", "Objects whose upload to the adapter was given up after its last retry; L1 may then evict them without an L2 copy.", []string{"l2_name"}}
	dStoreDropped   = desc{"l2_store_dropped_objects_total", "Uploads still queued when the engine stopped, dropped.", nil}
	dLeaseExpired   = desc{"l1_expired_leases_total", "L1 leases that ran out, by kind: read (the object's read locks voided), write (an uncommitted reservation reclaimed or refused at commit).", []string{"kind"}}
	dInflightSt     = desc{"num_inflight_l2_stores", "L2 store tasks in flight.", []string{"l2_name", "adapter_index"}}
	dInflightLd     = desc{"num_inflight_l2_loads", "L2 load tasks in flight.", []string{"l2_name", "adapter_index"}}
	// A Go addition: upstream reports the S3 breaker only in /status.
	dBreaker = desc{"l2_breaker_state", "L2 adapter circuit breaker: 0 closed, 1 open (calls fail at once), 2 half-open (one probe decides); 0 for adapters without a breaker.", []string{"l2_name", "adapter_index"}}
)

func (d desc) prom() *prometheus.Desc {
	return prometheus.NewDesc(Namespace+"_"+d.name, d.help, d.labels, nil)
}

func (e *engineCollector) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	src, base := e.src, e.base
	e.mu.Unlock()
	if src == nil {
		return
	}
	c := src()
	var b stats.Counters
	if base != nil {
		b = *base
	}
	gauge := func(d desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d.prom(), prometheus.GaugeValue, v, lv...)
	}
	counter := func(d desc, v, base int64, lv ...string) {
		n := v - base
		if n < 0 { // the engine was replaced; report raw
			n = v
		}
		ch <- prometheus.MustNewConstMetric(d.prom(), prometheus.CounterValue, float64(n), lv...)
	}
	salted := func(d desc, cur, old map[string]int64) {
		for _, s := range sortedKeys(cur) {
			counter(d, cur[s], old[s], s)
		}
	}
	gauge(dL1Used, float64(c.L1UsedBytes))
	ratio := 0.0
	if c.L1TotalBytes > 0 {
		ratio = float64(c.L1UsedBytes) / float64(c.L1TotalBytes)
	}
	gauge(dL1Ratio, ratio)
	gauge(dL1Staging, float64(c.L1StagingBytes))
	salted(dL1Read, c.L1Read, b.L1Read)
	salted(dL1Write, c.L1Write, b.L1Write)
	salted(dL1Evicted, c.L1Evicted, b.L1Evicted)
	counter(dTicks, c.L1EvictionLoopTicks, b.L1EvictionLoopTicks)
	counter(dTriggered, c.L1EvictionLoopTriggered, b.L1EvictionLoopTriggered)
	counter(dAllocFail, c.L1AllocFailuresStore, b.L1AllocFailuresStore, "l1_store")
	counter(dAllocFail, c.L1AllocFailuresPrefetch, b.L1AllocFailuresPrefetch, "l2_prefetch")
	counter(dReadFail, c.L1ReadFailuresNotFound, b.L1ReadFailuresNotFound, "l1_retrieve", "not_found")
	counter(dPrefFail, c.L2PrefetchFailOOM, b.L2PrefetchFailOOM, "l1_oom")
	// Lookups answered without L2 because --l2-lookup-timeout-ms ran out.
	counter(dPrefFail, c.L2LookupTimeouts, b.L2LookupTimeouts, "lookup_timeout")
	counter(dPrefFail, c.L2LookupUnavailable, b.L2LookupUnavailable, "adapter_unavailable")
	counter(dPrefDropped, c.PrefetchDropped, b.PrefetchDropped, "queue_full")
	counter(dPrefDropped, c.PrefetchReaped, b.PrefetchReaped, "unpolled")
	counter(dStoreDropped, c.StoreQueueDropped, b.StoreQueueDropped)
	counter(dLeaseExpired, c.L1ReadLeasesExpired, b.L1ReadLeasesExpired, "read")
	counter(dLeaseExpired, c.L1WriteLeasesExpired, b.L1WriteLeasesExpired, "write")
	gauge(dActiveJobs, float64(c.ActivePrefetchJobs))
	counter(dPrefReq, c.PrefetchRequests, b.PrefetchRequests)
	counter(dPrefHit, c.PrefetchHitChunksL1, b.PrefetchHitChunksL1, "l1")
	counter(dPrefHit, c.PrefetchHitChunksL2, b.PrefetchHitChunksL2, "l2")
	counter(dPrefMiss, c.PrefetchMissChunks, b.PrefetchMissChunks)
	counter(dL2Lookup, c.L2PrefetchLookup, b.L2PrefetchLookup)
	salted(dL2LookupObj, c.L2PrefetchLookupObj, b.L2PrefetchLookupObj)
	counter(dL2LoadSub, c.L2PrefetchLoadSub, b.L2PrefetchLoadSub)
	salted(dL2LoadSubObj, c.L2PrefetchLoadSubObj, b.L2PrefetchLoadSubObj)
	salted(dL2LoadDone, c.L2PrefetchLoadDone, b.L2PrefetchLoadDone)
	salted(dStoreSubObj, c.L2StoreSubmittedObj, b.L2StoreSubmittedObj)
	salted(dStoreDoneObj, c.L2StoreCompletedObj, b.L2StoreCompletedObj)
	salted(dL2EvictedObj, c.L2EvictedObj, b.L2EvictedObj)
	seen := map[string]bool{}
	for i, a := range c.L2 {
		var ob stats.L2Counters
		if i < len(b.L2) {
			ob = b.L2[i]
		}
		name := a.TypeName
		if seen[name] { // duplicate type names would collide as label sets
			name += "_" + strconv.Itoa(a.Index)
		}
		seen[name] = true
		idx := strconv.Itoa(a.Index)
		counter(dStoreSub, a.StoreSubmitted, ob.StoreSubmitted, name)
		counter(dStoreDone, a.StoreCompleted, ob.StoreCompleted, name)
		counter(dLoadDone, a.LoadCompleted, ob.LoadCompleted, name)
		counter(dEvictDelFail, a.EvictionDeleteFailed, ob.EvictionDeleteFailed, name)
		counter(dStoreAbandoned, a.StoreAbandoned, ob.StoreAbandoned, name)
		gauge(dL2Usage, float64(a.UsageBytes), name)
		gauge(dInflightSt, float64(a.InflightStores), name, idx)
		gauge(dInflightLd, float64(a.InflightLoads), name, idx)
		gauge(dBreaker, float64(a.BreakerState), name, idx)
	}
}

func sortedKeys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// LookupResult is what RecordLookup needs of the engine's answer to a
// lookup (engine.PrefetchResult's fields of the same names).
type LookupResult struct {
	// PrefixChunks is the leading run of chunks that hit.
	PrefixChunks int
	// L1Keys were already resident; L2Keys were loaded from L2.
	L1Keys, L2Keys int
	// Duration is the time from submission to the answer; observed in
	// lmcache_mp_lookup_duration_seconds when positive.
	Duration time.Duration
}

// RecordLookup counts one finished lookup, from the vLLM data path or the
// HTTP KV API alike: requestedChunks whole chunks were asked for and res is
// the engine's answer.
func (m *Metrics) RecordLookup(model, salt string, chunkSize, requestedChunks int, res LookupResult) {
	m.Lookups.WithLabelValues(model, salt).Inc()
	m.LookupRequestedTokens.WithLabelValues(model, salt).Add(float64(requestedChunks * chunkSize))
	m.LookupHitTokens.WithLabelValues(model, salt).Add(float64(res.PrefixChunks * chunkSize))
	m.LookupHitL1Keys.WithLabelValues(model, salt).Add(float64(res.L1Keys))
	m.LookupHitL2Keys.WithLabelValues(model, salt).Add(float64(res.L2Keys))
	if res.Duration > 0 {
		m.LookupSeconds.WithLabelValues().Observe(res.Duration.Seconds())
	}
}
