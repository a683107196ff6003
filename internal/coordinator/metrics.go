package coordinator

import (
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
)

const metricPrefix = "lmcache_coordinator_"

// The event doors, as the door label of the event-gate metrics.
const (
	doorEvents      = "events"
	doorQuotaEvents = "quota_events"
)

// metrics lives on a private registry so tests and embedders never collide
// with the global one.
type metrics struct {
	// events_ingested_total's children, resolved once: ingest adds to
	// them on every batch.
	storeEvents, lookupEvents, deleteEvents prometheus.Counter
	eventBatches                            prometheus.Counter
	evictionCycles                          prometheus.Counter
	keysDispatched                          prometheus.Counter
	dispatchFailures                        prometheus.Counter
	dispatchNotOK                           prometheus.Counter
	phantomsDropped                         prometheus.Counter
	registrationsRefused                    prometheus.Counter
	quotasRefused                           prometheus.Counter
	seqTrackerResets                        prometheus.Counter
	resyncSkipped                           prometheus.Counter
	resyncPages                             prometheus.Counter
	resyncKeys                              prometheus.Counter
	resyncSuperseded                        prometheus.Counter
	resyncStopped                           *prometheus.CounterVec
	seqGaps                                 prometheus.Counter
	seqRegressions                          prometheus.Counter
	// The event gate's outcomes, by door and result, and its side facts.
	gateBatches    *prometheus.CounterVec
	gateGaps       *prometheus.CounterVec
	gateFences     prometheus.Counter
	l1FactsFenced  prometheus.Counter
	l1FactsDropped prometheus.Counter
	spansDropped   *prometheus.CounterVec
	// superseded counts store events not applied because a newer delete
	// of the key was read first (Server.tombs, tombstones.go).
	superseded prometheus.Counter
	handler    http.Handler
	// reg is the private registry, for collectors other files add.
	reg *prometheus.Registry
}

func newMetrics(s *Server) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{reg: reg}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + "events_ingested_total", Help: "Usage events ingested through POST /quota/events, by type."}, []string{"type"})
	m.storeEvents = events.WithLabelValues("store")
	m.lookupEvents = events.WithLabelValues("lookup")
	m.deleteEvents = events.WithLabelValues("delete")
	m.eventBatches = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "event_batches_total", Help: "Usage-event batches accepted."})
	m.evictionCycles = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "eviction_cycles_total", Help: "Eviction cycles run."})
	m.keysDispatched = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "eviction_keys_dispatched_total", Help: "Keys sent to MP servers in successful DELETE /cache/objects requests."})
	m.dispatchFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "eviction_dispatch_failures_total", Help: "DELETE /cache/objects requests that failed (transport error or non-2xx)."})
	m.resyncPages = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "resync_pages_total", Help: "GET /cache/objects pages read by the startup resync."})
	m.resyncKeys = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "resync_keys_total", Help: "Keys recorded by the startup resync."})
	m.resyncSuperseded = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "resync_entries_superseded_total", Help: "GET /cache/objects entries the startup resync did not record because a delete event of the key was applied after the resync began (the listing predates it)."})
	m.resyncStopped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + "resync_stopped_total", Help: "Startup resyncs that stopped before the listing's end, keeping what they had recorded, by reason: token_repeated (the server handed out a page token it had given before: its listing cycles), page_limit (ceil(67,108,864 / RESYNC_PAGE_SIZE) pages read and the listing still had not ended)."}, []string{"reason"})
	m.resyncStopped.WithLabelValues(resyncStopTokenRepeated)
	m.resyncStopped.WithLabelValues(resyncStopPageLimit)
	m.seqGaps = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "event_seq_gaps_total", Help: "Event batches whose seq skipped ahead of the instance's previous batch (lost batches)."})
	m.seqRegressions = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "event_seq_regressions_total", Help: "Event batches whose seq did not advance (reporter restart or replay); still applied."})
	m.dispatchNotOK = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "eviction_dispatch_not_ok_total", Help: "DELETE /cache/objects requests answered 2xx with \"ok\": false; also counted in eviction_dispatch_failures_total and re-planned."})
	m.phantomsDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "eviction_phantom_keys_dropped_total", Help: "Keys removed from the ledger without a delete event: sent for eviction 3 times, each answered 2xx, and no delete or store event of them came back (most likely gone from L2 already, their delete event lost); their bytes no longer count toward their salt."})
	m.registrationsRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "registrations_refused_total", Help: "POST /instances refused with 503 because the registry was full (100,000 instances or 64 MiB of registrations); the WARN line is logged at most once per 10 s, with the number held back."})
	m.quotasRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "quotas_refused_total", Help: "PUT /quota/{cache_salt} requests for a new cache_salt refused with 400 because 100,000 quotas were registered (the bound); updating or deleting a registered salt's quota is always allowed."})
	m.seqTrackerResets = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "event_seq_tracker_resets_total", Help: "Times the per-instance seq tracker was cleared because it held too many instance ids (gaps right after a reset go uncounted)."})
	m.resyncSkipped = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "resync_entries_skipped_total", Help: "GET /cache/objects entries the startup resync could not use (malformed key or size); not recorded."})
	m.gateBatches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + "event_gate_batches_total", Help: "Event batches offered to the event gate, by door (events, quota_events) and result: admitted; duplicate and stale (POST /events only, dropped unapplied); replay_applied (POST /quota/events seq did not advance, applied anyway as the spec says)."}, []string{"door", "result"})
	m.gateGaps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + "event_gate_gaps_total", Help: "Admitted event batches whose seq skipped ahead of the stream's previous one (the emitter lost batches), by door."}, []string{"door"})
	m.gateFences = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "event_gate_fences_total", Help: "POST /events incarnation changes: the emitter restarted and the L1 facts of its previous incarnation were dropped (L2 facts kept)."})
	m.l1FactsFenced = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "l1_facts_fenced_total", Help: "L1 key facts dropped because their emitter's incarnation changed, or it deregistered or was swept."})
	m.l1FactsDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "l1_facts_dropped_total", Help: "L1 store facts from POST /events not recorded because the L1 view was full (1,000,000 keys)."})
	m.spansDropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + "trace_spans_dropped_total", Help: "OpenTelemetry spans lost (--enable-tracing), by reason: export_failed (the OTLP collector refused them or could not be reached), queue_full (2048 spans, or OTEL_BSP_MAX_QUEUE_SIZE, were already waiting for export), shutdown (the span ended after tracing shutdown had begun, too late to be exported)."}, []string{"reason"})
	m.spansDropped.WithLabelValues("export_failed")
	m.spansDropped.WithLabelValues("queue_full")
	m.spansDropped.WithLabelValues("shutdown")
	m.superseded = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "events_superseded_total", Help: "L2 store events (POST /events, Kafka) not applied: a delete of the key with the same or a newer ts was read before them (the stream has no order across instances), so the object is gone."})
	// s.tombs may be replaced by a checkpoint restore before the first
	// scrape, so the gauges read it through s.
	tombs := func() *tombstones { return s.tombs }
	const tombstoneDroppedHelp = "Event tombstones dropped, by reason: capacity (the set was full; oldest first) or expired (older than an hour of event time). A store of a dropped key is applied as if no delete had been read."
	reg.MustRegister(m.superseded,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "event_tombstones", Help: "Keys whose delete was read while the ledger did not hold them, kept to refuse their older stores (at most 1,000,000, for an hour of event time)."},
			func() float64 { n, _, _ := tombs().counts(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metricPrefix + "event_tombstones_dropped_total", Help: tombstoneDroppedHelp, ConstLabels: prometheus.Labels{"reason": "capacity"}},
			func() float64 { _, c, _ := tombs().counts(); return float64(c) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metricPrefix + "event_tombstones_dropped_total", Help: tombstoneDroppedHelp, ConstLabels: prometheus.Labels{"reason": "expired"}},
			func() float64 { _, _, e := tombs().counts(); return float64(e) }),
	)
	reg.MustRegister(m.spansDropped)
	for _, door := range []string{doorEvents, doorQuotaEvents} {
		m.gateGaps.WithLabelValues(door)
		for _, r := range []string{"admitted", "duplicate", "stale", "replay_applied"} {
			if door == doorQuotaEvents && (r == "duplicate" || r == "stale") || door == doorEvents && r == "replay_applied" {
				continue
			}
			m.gateBatches.WithLabelValues(door, r)
		}
	}
	reg.MustRegister(m.gateBatches, m.gateGaps, m.gateFences, m.l1FactsFenced, m.l1FactsDropped)
	reg.MustRegister(m.seqGaps, m.seqRegressions, m.dispatchNotOK, m.phantomsDropped, m.registrationsRefused, m.quotasRefused, m.seqTrackerResets, m.resyncSkipped, m.resyncSuperseded, m.resyncStopped)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "state_file_corrupt", Help: "1 when the --state-file could not be parsed at startup and was moved aside (the coordinator started with empty quotas and pins)."},
		func() float64 {
			if s.stateCorrupt {
				return 1
			}
			return 0
		}))
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Name: metricPrefix + "build_info", Help: "Build of this lmcache coordinator (value 1).", ConstLabels: buildinfo.Labels()})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo)
	reg.MustRegister(events, m.eventBatches, m.evictionCycles, m.keysDispatched, m.dispatchFailures, m.resyncPages, m.resyncKeys)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "registered_instances", Help: "MP servers currently registered."},
			func() float64 { return float64(s.reg.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "registered_quotas", Help: "cache_salt quotas registered; a new salt is refused while 100,000 or more are (quotas_refused_total)."},
			func() float64 { return float64(s.quotas.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "tracked_keys", Help: "L2 keys tracked for usage and LRU."},
			func() float64 { return float64(s.ledger.Stats().Keys) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "tracked_bytes", Help: "L2 bytes tracked across all salts."},
			func() float64 { return float64(s.ledger.Stats().Bytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "active_pins", Help: "Distinct keys with a positive pin count."},
			func() float64 { return float64(s.ledger.Stats().PinnedKeys) }),
		&saltCollector{s: s, top: s.cfg.MetricsTopSalts,
			desc: prometheus.NewDesc(metricPrefix+"salt_usage_bytes", "Tracked L2 bytes of the salts with the most usage (top N by --metrics-top-salts).", []string{"cache_salt"}, nil)},
		newThresholdCollector(s),
	)
	reg.MustRegister(s.haCollectors()...)
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m
}

// saltCollector exports per-salt usage for at most top salts, so a fleet
// with thousands of tenants cannot blow up the series count.
type saltCollector struct {
	s    *Server
	top  int
	desc *prometheus.Desc
}

func (c *saltCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *saltCollector) Collect(ch chan<- prometheus.Metric) {
	if c.top <= 0 {
		return
	}
	usage, _ := c.s.ledger.Usage()
	type kv struct {
		salt  string
		bytes int64
	}
	rows := make([]kv, 0, len(usage))
	for k, v := range usage {
		rows = append(rows, kv{k, v})
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].bytes != rows[j].bytes {
			return rows[i].bytes > rows[j].bytes
		}
		return rows[i].salt < rows[j].salt
	})
	if len(rows) > c.top {
		rows = rows[:c.top]
	}
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(r.bytes), r.salt)
	}
}

// CountDroppedSpans counts n spans the OTLP exporter lost for reason in
// lmcache_coordinator_trace_spans_dropped_total (tracing.Config.Dropped).
func (s *Server) CountDroppedSpans(reason string, n int) {
	s.metrics.spansDropped.WithLabelValues(reason).Add(float64(n))
}
