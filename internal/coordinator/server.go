// Package coordinator is the LMCache MP fleet coordinator: the HTTP API
// (membership, quotas and usage, cache control, metrics, OpenAPI) and the
// background loops (health sweep, eviction, startup resync) that share one
// Server. The binary and the tests both build it with New and run it with
// Run, so tests exercise exactly what ships.
package coordinator

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lmcache-go/lmcache/internal/atomicfile"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/eventgate"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/coordinator/mpclient"
	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
	"github.com/lmcache-go/lmcache/internal/coordinator/registry"
	"github.com/lmcache-go/lmcache/internal/coordinator/statefile"
	"github.com/lmcache-go/lmcache/internal/httplimit"
	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/logthrottle"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/redact"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// DefaultDrainTimeout bounds how long Run waits, after its context is
// cancelled, for in-flight requests to finish before closing connections.
const DefaultDrainTimeout = 5 * time.Second

// Names of the coordinator's loops in its periodic registry
// (GET /periodic-threads).
const (
	LoopHealthSweep = "coordinator-health-sweep"
	LoopEviction    = "coordinator-eviction"
	LoopResync      = "coordinator-startup-resync"
	// LoopLedgerReserve prepares the ledger's next entry page and index
	// table off the ingest path (ledger.Refill).
	LoopLedgerReserve = "coordinator-ledger-reserve"
)

// ledgerReserveWait is the longest the reserve loop sleeps when the ledger
// does not wake it; a wake-up (a page or table wanted) ends it at once. It
// is also the loop's interval, so it stays healthy (a cycle within three
// intervals) while Refill faults in a 1 GiB table at 18 us a page (about 6 s
// with its pauses).
const ledgerReserveWait = 5 * time.Second

// Server is one coordinator instance.
type Server struct {
	cfg     config.Config
	log     *slog.Logger
	reg     *registry.Registry
	quotas  *quota.Registry
	ledger  *ledger.Ledger
	hasher  *tokenhash.Hasher
	mp      *mpclient.Client
	metrics *metrics
	// tombs refuses L2 stores read after a newer delete of the same key
	// (tombstones.go); used under the event gate's lock.
	tombs   *tombstones
	state   *statefile.Writer
	handler http.Handler
	table   *httproute.Table
	loops   *periodic.Registry
	ha      *haState // active/standby on etcd (ha.go); nil without --ha-etcd-endpoints

	drainTimeout time.Duration
	// beforeClose, when set (tests only), runs just before Run closes the
	// MP client and the HA session, so a test can see that no handler is
	// running by then.
	beforeClose func()
	// stateCorrupt records that the state file could not be parsed at
	// startup and was moved aside (reported by /healthz and a gauge).
	stateCorrupt bool

	// dispatchWG tracks in-flight eviction DELETEs; Run waits for them.
	dispatchWG sync.WaitGroup
	// cycleMu serialises eviction cycles (the loop and RunEvictionCycle).
	cycleMu sync.Mutex
	// intentMu serialises applyIntent's change-write-undo sequences.
	intentMu sync.Mutex

	// gate holds the per-emitter seq cursors of both event doors: POST
	// /events is fenced and deduplicated, POST /quota/events only observed
	// (like upstream's spec era, seq never drops a batch there).
	gate *eventgate.Gate
	// l1 is the per-instance L1 usage reported through POST /events.
	l1 *l1View

	// kafka is the Kafka event door (--event-transport kafka), ckpt the
	// checkpointer (--checkpoint-path); nil when off (kafkaingest*.go).
	kafka *kafkaIngest
	ckpt  *checkpointer
	// resyncSkipped is 1 once the startup resync was left out: a
	// checkpoint was restored (resyncSkippedForCheckpoint) or, in HA mode
	// on Kafka, this coordinator came to lead (resyncSkippedOnStream).
	resyncSkipped atomic.Int64

	// warns throttles the WARN lines that can repeat once per request:
	// "registry_full" and "gate_reset", each at most every warnInterval.
	warns *logthrottle.Limiter
}

// warnInterval is how often a throttled WARN (a registry-full refusal, an
// event-gate reset) is logged at most. Both can repeat once per request
// under load (a fleet past the registry's bound re-registering every few
// seconds, a flood of new instance ids), and a line per request says no
// more than the first; the metrics count every occurrence.
const warnInterval = 10 * time.Second

// Option adjusts a Server.
type Option func(*Server)

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithMPClient replaces the MP-server client (tests inject short timeouts).
// The configured --mp-auth-token is applied to it.
func WithMPClient(c *mpclient.Client) Option { return func(s *Server) { s.mp = c } }

// WithDrainTimeout sets how long Run lets in-flight requests finish after
// its context is cancelled (default DefaultDrainTimeout).
func WithDrainTimeout(d time.Duration) Option { return func(s *Server) { s.drainTimeout = d } }

// New validates cfg, loads the state file if configured and builds the
// server. Nothing runs until Run.
func New(cfg config.Config, opts ...Option) (*Server, error) {
	var hopts []tokenhash.Option
	if cfg.HashRootHex != "" {
		root, err := hex.DecodeString(cfg.HashRootHex)
		if err != nil {
			return nil, fmt.Errorf("coordinator: --hash-root-hex: %w", err)
		}
		hopts = append(hopts, tokenhash.WithRoot(root))
	}
	h, err := tokenhash.New(cfg.HashAlgorithm, cfg.ChunkSize, hopts...)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	s := &Server{
		cfg:    cfg,
		log:    slog.Default(),
		reg:    registry.New(nil),
		quotas: quota.New(),
		ledger: ledger.New(),
		hasher: h,
		mp:     mpclient.New(30 * time.Second),
		loops:  periodic.NewRegistry(),

		drainTimeout: DefaultDrainTimeout,
		gate:         eventgate.New(maxSeqTracked),
		tombs:        newTombstones(),
		l1:           newL1View(),
	}
	s.warns = logthrottle.New()
	for _, o := range opts {
		o(s)
	}
	if cfg.MPAuthToken != "" {
		s.mp.Token = cfg.MPAuthToken
	}
	s.log = s.log.With("component", "coordinator")
	if err := s.initHA(); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	if cfg.StateFile != "" {
		s.removeStaleTemps(cfg.StateFile)
		err := s.loadState()
		if errors.Is(err, statefile.ErrCorrupt) {
			// Upstream keeps no state and starts cold; refusing to start
			// would turn one torn write into an outage. The bad file is
			// kept for inspection, and /healthz and a gauge say so.
			aside := fmt.Sprintf("%s.corrupt-%s", cfg.StateFile, time.Now().UTC().Format("20060102T150405.000000000Z"))
			if rerr := os.Rename(cfg.StateFile, aside); rerr != nil {
				return nil, fmt.Errorf("coordinator: %w; moving it aside failed: %w", err, rerr)
			}
			s.log.Error("state file is corrupt; moved aside, starting with empty quotas and pins", "path", cfg.StateFile, "moved_to", aside, "err", err)
			s.stateCorrupt = true
			s.quotas = quota.New()
			s.ledger = ledger.New()
		} else if err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		s.state = statefile.NewWriter(cfg.StateFile)
		// Write once now so an unwritable path fails at startup, not at the
		// first quota change.
		if err := s.state.Save(s.stateSnapshot); err != nil {
			return nil, fmt.Errorf("coordinator: state file: %w", err)
		}
	}
	if err := s.setupIngest(); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	s.metrics = newMetrics(s)
	s.metrics.reg.MustRegister(s.ingestCollectors()...)
	s.metrics.reg.MustRegister(s.loops.Collector(metricPrefix[:len(metricPrefix)-1])) // lmcache_coordinator_periodic_thread_*
	t, err := s.buildTable()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	s.table, s.handler = t, t.Handler()
	return s, nil
}

// Handler is the HTTP API (for embedding or httptest).
func (s *Server) Handler() http.Handler { return s.handler }

// Run serves on ln and runs the background loops until ctx is cancelled,
// then shuts the listener down gracefully and waits for every goroutine it
// started. It returns nil after a clean stop.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	// httplimit bounds header bytes, concurrent connections and slow
	// header senders, as for `lmcache server`.
	limits := httplimit.Limits{IdleTimeout: time.Duration(s.cfg.TimeoutKeepAlive) * time.Second}
	srv := httplimit.NewServer(s.handler, limits, slog.NewLogLogger(s.log.Handler(), slog.LevelWarn))
	// Requests must not see ctx's cancellation: on SIGTERM the ones in
	// flight drain (up to drainTimeout) instead of failing.
	srv.BaseContext = func(net.Listener) context.Context { return context.WithoutCancel(ctx) }
	s.log.Info("MP coordinator listening on http://" + ln.Addr().String())
	if s.cfg.AuthToken == "" && !loopback(ln.Addr()) {
		s.log.Warn("no --auth-token set and the listener is not on loopback: anyone who can reach it can change quotas and pins, deregister servers and post usage events", "addr", ln.Addr().String())
	}

	var wg sync.WaitGroup
	loopCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, run := range s.startLoops(loopCtx) {
		wg.Add(1)
		go func() { defer wg.Done(); run() }()
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(httplimit.Listener(ln, limits)) }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	// Stop accepting and let in-flight requests finish first; the loops
	// (and the dispatches they own) stop after. Stop returns only once
	// every handler has returned, also past the drain deadline, so that
	// nothing closed below (the MP client, the etcd session) is still in
	// use by one, e.g. by an intent write of up to intentWriteTimeout.
	if stopErr := srv.Stop(s.drainTimeout); stopErr != nil {
		s.log.Warn("drain deadline passed; closed remaining connections", "drain_timeout", s.drainTimeout, "err", stopErr)
	}
	cancel()
	if err == nil {
		err = <-serveErr
	}
	wg.Wait()
	s.dispatchWG.Wait()
	// Ingest has stopped (HTTP drained, the Kafka worker committed and
	// left its group): what the checkpoint captures now is final.
	s.finalCheckpoint()
	if s.beforeClose != nil {
		s.beforeClose()
	}
	s.mp.Close()
	s.closeHA()
	s.log.Info("MP coordinator stopped")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// scrubText hides the configured tokens (--auth-token, --mp-auth-token)
// in text that has no field names to go by: MP servers' replies and
// transport errors, which could echo the token the coordinator sent.
func (s *Server) scrubText(text string) string {
	return redact.Secrets(text, s.cfg.AuthToken, s.cfg.MPAuthToken)
}

// scrub renders err for a log line with the configured tokens hidden (the
// route table's onError does the same for error bodies).
func (s *Server) scrub(err error) string { return s.scrubText(err.Error()) }

// loopback reports whether addr only accepts local connections.
func loopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// startLoops registers the enabled background loops in the periodic
// registry (so /periodic-threads shows them and /periodic-threads-health
// reports a stuck one) and returns their bodies for Run to start, each on
// a goroutine Run owns. The sweep and eviction loops wait one interval
// before their first cycle, as a ticker does.
func (s *Server) startLoops(ctx context.Context) []func() {
	out := s.haLoops(ctx)
	if s.cfg.HealthCheckInterval > 0 {
		d := config.Seconds(s.cfg.HealthCheckInterval)
		l := s.loops.Register(LoopHealthSweep, periodic.High, d, d, s.healthCycle)
		out = append(out, func() { l.Run(ctx) })
	}
	if s.cfg.EvictionCheckInterval > 0 {
		d := config.Seconds(s.cfg.EvictionCheckInterval)
		l := s.loops.Register(LoopEviction, periodic.High, d, d, s.evictionCycle)
		out = append(out, s.afterIngestReady(ctx, func() { l.Run(ctx) }))
	}
	if s.cfg.EnableStartupResync && !s.resyncSkippedForCheckpoint() {
		out = append(out, s.afterIngestReady(ctx, s.resyncLoop(ctx)))
	}
	// Low: if it stops, ingest allocates under the ledger lock again
	// (slower requests, counted), nothing is lost.
	reserve := s.loops.RegisterWorker(LoopLedgerReserve, periodic.Low, ledgerReserveWait, s.reserveCycle)
	out = append(out, func() { reserve.Run(ctx) })
	return append(out, s.ingestLoops(ctx)...)
}

// reserveCycle waits until the ledger wants memory (or ledgerReserveWait)
// and prepares it; see ledger.Refill. s.ledger is set for good by New.
func (s *Server) reserveCycle(ctx context.Context) (periodic.Summary, error) {
	s.ledger.WaitNeed(ctx, ledgerReserveWait)
	pages, tables := s.ledger.Refill(ctx)
	r := s.ledger.Reserve()
	u := func(n uint64) string { return strconv.FormatUint(n, 10) }
	return periodic.Summary{Message: fmt.Sprintf("prepared entry_pages=%d index_tables=%d", pages, tables), Extra: map[string]string{
		"prepared_entry_pages": u(r.PreparedPages), "prepared_index_tables": u(r.PreparedTables),
		// Allocated under the lock because nothing was ready.
		"ingest_path_entry_pages": u(r.ColdPages), "ingest_path_index_tables": u(r.ColdTables),
		// Chunks held back for ingest requests in flight, and those that
		// went ahead after the longest wait.
		"yield_waits": u(r.YieldWaits), "yield_capped": u(r.YieldCapped),
	}}, nil
}

func (s *Server) healthCycle(context.Context) (periodic.Summary, error) {
	dropped := s.reg.SweepStale(config.Seconds(s.cfg.InstanceTimeout))
	for _, id := range dropped {
		s.log.Warn("instance missed heartbeats; deregistered", "instance_id", id, "timeout_s", s.cfg.InstanceTimeout, "l1_facts_dropped", s.releaseL1(id))
	}
	return periodic.Summary{Message: fmt.Sprintf("dropped=%d registered=%d", len(dropped), s.reg.Len())}, nil
}

// maxSeqTracked bounds each event door's per-instance cursor map.
var maxSeqTracked = eventgate.DefaultMaxStreams

// observeSeq records a /quota/events batch's seq for its instance and
// counts gaps (lost batches: the reporter drops failed ones) and
// regressions (a restarted reporter starts again at 1, or a replay); the
// batch is applied whatever the outcome.
func (s *Server) observeSeq(instance string, seq int64) {
	out := s.gate.Observe(instance, seq)
	s.countReset(out)
	switch {
	case out.Gap:
		s.metrics.seqGaps.Inc()
		s.metrics.gateGaps.WithLabelValues(doorQuotaEvents).Inc()
		s.metrics.gateBatches.WithLabelValues(doorQuotaEvents, "admitted").Inc()
		s.log.Debug("usage-event seq gap", "instance_id", instance, "seq", seq)
	case out.Replay:
		s.metrics.seqRegressions.Inc()
		s.metrics.gateBatches.WithLabelValues(doorQuotaEvents, "replay_applied").Inc()
		s.log.Debug("usage-event seq went back (reporter restart or replay)", "instance_id", instance, "seq", seq)
	default:
		s.metrics.gateBatches.WithLabelValues(doorQuotaEvents, "admitted").Inc()
	}
}

// countReset counts a cleared cursor map.
func (s *Server) countReset(out eventgate.Outcome) {
	if out.Reset {
		// Bound memory against arbitrary instance ids. Forgetting every
		// cursor means the next gap or duplicate of each stream goes
		// unnoticed, so the reset itself is counted.
		s.metrics.seqTrackerResets.Inc()
		s.warns.Log(s.log, slog.LevelWarn, "gate_reset", warnInterval, "usage-event seq tracker reset: too many distinct instance ids", "limit", maxSeqTracked)
	}
}

// applyIntent makes one operator-intent change (a quota, the default limit,
// pins) durable before it returns: apply runs, then the state file is
// written and fsync'd, so a 200 sent after it survives kill -9. When the
// write fails the change is undone (quotas and pins restored as they were)
// and the error is returned for a 500: the caller must not answer 200.
// Changes are serialised so an undo never discards another write.
func (s *Server) applyIntent(apply func()) error {
	s.intentMu.Lock()
	defer s.intentMu.Unlock()
	if s.state == nil {
		apply()
		return nil
	}
	quotas, pins := s.quotas.Snapshot(), s.ledger.Pins()
	apply()
	if err := s.state.Save(s.stateSnapshot); err != nil {
		if errors.Is(err, atomicfile.ErrNotDurable) {
			// The file already holds the change: undoing it here would
			// leave memory and file disagreeing, and a restart would bring
			// back what the caller was told failed.
			s.log.Error("state file replaced but its directory fsync failed; the change is in effect and may not survive a power loss", "path", s.cfg.StateFile, "err", err)
			return nil
		}
		s.quotas.Restore(quotas)
		s.ledger.ReplacePins(pins)
		s.log.Error("writing state file failed; change undone", "path", s.cfg.StateFile, "err", err)
		return fmt.Errorf("coordinator: state file %s: %w", s.cfg.StateFile, err)
	}
	return nil
}

// removeStaleTemps deletes the temporary files an interrupted write of path
// left (atomicfile.RemoveStaleTemps) and logs what it did; a failure only
// leaves them.
func (s *Server) removeStaleTemps(path string) {
	n, err := atomicfile.RemoveStaleTemps(path)
	if n > 0 {
		s.log.Warn("removed temporary files an interrupted write left", "path", path, "files", n)
	}
	if err != nil {
		s.log.Warn("stale temporary files not removed", "path", path, "err", err)
	}
}

func (s *Server) stateSnapshot() statefile.State {
	lim := s.quotas.Snapshot()
	st := statefile.State{DefaultLimitBytes: lim.Default, Quotas: lim.Explicit}
	for _, p := range s.ledger.Pins() {
		st.Pins = append(st.Pins, statefile.Pin{Key: p.Key.Encode(), Count: p.Count})
	}
	return st
}

func (s *Server) loadState() error {
	st, err := statefile.Load(s.cfg.StateFile)
	if err != nil {
		return err
	}
	s.quotas.Restore(quota.Limits{Explicit: st.Quotas, Default: st.DefaultLimitBytes})
	s.warnQuotasOverBound("state_file")
	pins := make([]ledger.PinCount, 0, len(st.Pins))
	for i, p := range st.Pins {
		k, err := p.Key.Decode()
		if err != nil {
			return fmt.Errorf("%w %s: pin %d: %w", statefile.ErrCorrupt, s.cfg.StateFile, i, err)
		}
		pins = append(pins, ledger.PinCount{Key: k, Count: p.Count})
	}
	s.ledger.RestorePins(pins)
	s.log.Info("state file loaded", "path", s.cfg.StateFile, "quotas", len(st.Quotas), "pins", len(pins))
	return nil
}

// keysToEncoded converts keys to their wire form.
func keysToEncoded(ks []objkey.Key) []objkey.Encoded {
	out := make([]objkey.Encoded, len(ks))
	for i, k := range ks {
		out[i] = k.Encode()
	}
	return out
}
