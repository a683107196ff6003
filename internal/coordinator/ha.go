package coordinator

// Active/standby coordinators on etcd (--ha-etcd-endpoints). Every
// coordinator ingests events, so each ledger stays hot; one leads, elected
// on an etcd lease (internal/leader). Only the leader runs the eviction loop,
// the startup resync (over HTTP only: on Kafka the new leader's ledger is
// the stream's, so it skips it; resyncOnStream) and the prefetch relay, and
// accepts intent writes (quotas, the default limit, pins), which it commits
// to etcd before answering (internal/coordinator/intentstore); every
// coordinator mirrors
// that intent through a watch (ha_intent.go). A standby answers
// leader-only routes with 307 to the leader's advertised URL, or 503 with
// a JSON body when no leader is known, stays live on /healthz and reports
// not-ready on GET /readyz. A leader's authority ends at its renew deadline,
// before its lease can expire: eviction stops dispatching (in-flight
// DELETEs are cancelled with the term's context) and every dispatch carries
// the term's fencing token in its log line and a gauge.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lmcache-go/lmcache/internal/coordinator/intentstore"
	"github.com/lmcache-go/lmcache/internal/leader"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// Names of the HA loops in the periodic registry.
const (
	LoopHAElection = "coordinator-ha-election"
	LoopHAIntent   = "coordinator-ha-intent-mirror"
	// LoopHALease is the elector's lease-renewal loop: it runs while this
	// coordinator holds a lease (leading or queued), one cycle per renewal;
	// its failed runs are lmcache_coordinator_leader_renewal_failures_total.
	LoopHALease = "coordinator-ha-lease-renewal"
)

// haStepWait is how long one HA worker cycle waits for something to happen.
const haStepWait = time.Second

// intentWriteTimeout bounds one intent write to etcd (a handler waits for
// it before answering).
const intentWriteTimeout = 5 * time.Second

// Sentinels of the HA mode (503 in apiErrors).
var (
	// ErrNotLeader is a leader-only request that reached a coordinator
	// whose term ended while it was being handled.
	ErrNotLeader = errors.New("not the leader")
	// ErrIntentStore is an intent write etcd did not confirm.
	ErrIntentStore = errors.New("intent store unavailable")
)

// haState is the Server's HA machinery; nil without --ha-etcd-endpoints.
type haState struct {
	id       string // this coordinator's advertised URL, the election value
	election string // election key prefix
	cli      *clientv3.Client
	el       *leader.Elector
	store    *intentstore.Store

	// leaderURL is the last leader the election loop read from etcd (""
	// when none campaigns).
	leaderURL atomic.Pointer[string]

	termMu     sync.Mutex
	base       context.Context    // the loops' context, set before the elector runs
	termCtx    context.Context    // live while this term leads; nil otherwise
	termCancel context.CancelFunc // ends termCtx

	mirror intentMirror
	// quotaMu serialises the leader's quota PUTs from the bound check to
	// the apply of what etcd committed, so two new salts cannot both pass
	// the check for the last free entry.
	quotaMu sync.Mutex
	// Owned by the intent-mirror loop's goroutine.
	wch     clientv3.WatchChan
	wcancel context.CancelFunc

	lastFence    atomic.Int64
	redirects    *prometheus.CounterVec
	intentErrors prometheus.Counter
	intentApply  prometheus.Counter
}

// initHA builds the HA machinery when --ha-etcd-endpoints is set. Nothing
// connects or runs until Run.
func (s *Server) initHA() error {
	hc := s.cfg.HA
	if !hc.Enabled() {
		return nil
	}
	if s.cfg.StateFile != "" {
		return errors.New("--state-file and --ha-etcd-endpoints: in HA mode quotas, the default limit and pins live in etcd; drop --state-file")
	}
	id, err := hc.ID(s.cfg.Port)
	if err != nil {
		return err
	}
	cli, err := leader.NewClient(hc.Endpoints(), 0)
	if err != nil {
		return err
	}
	h := &haState{id: id, election: hc.EtcdPrefix + "leader", cli: cli, store: intentstore.New(cli, hc.EtcdPrefix+"intent/")}
	h.mirror.init()
	h.el, err = leader.New(leader.Config{Client: cli, ID: id, Prefix: h.election, TTL: time.Duration(hc.LeaseTTL) * time.Second,
		Logger: s.log, OnChange: s.onLeaderChange, Loops: s.loops, RenewLoopName: LoopHALease})
	if err != nil {
		_ = cli.Close()
		return err
	}
	h.redirects = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + "standby_redirects_total",
		Help: "Leader-only requests a standby answered: redirect (307 to the leader) or no_leader (503)."}, []string{"result"})
	h.redirects.WithLabelValues("redirect")
	h.redirects.WithLabelValues("no_leader")
	h.intentErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "intent_store_errors_total",
		Help: "Intent writes etcd did not confirm, and intent values read back that did not parse (skipped)."})
	h.intentApply = prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "intent_changes_applied_total",
		Help: "Quota, default-limit and pin changes applied to this coordinator from etcd (its own writes and watched ones)."})
	s.ha = h
	s.log.Info("HA mode: active/standby on etcd", "id", id, "endpoints", hc.Endpoints(), "lease_ttl_s", hc.LeaseTTL, "prefix", hc.EtcdPrefix)
	return nil
}

// haCollectors are the HA metrics (none without HA).
func (s *Server) haCollectors() []prometheus.Collector {
	if s.ha == nil {
		return nil
	}
	h := s.ha
	return append(h.el.Collectors(), h.redirects, h.intentErrors, h.intentApply,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "eviction_dispatch_fence_revision",
			Help: "Fencing token (leader term revision) stamped on this coordinator's most recent eviction dispatch; 0 before any."},
			func() float64 { return float64(h.lastFence.Load()) }))
}

// haLoops registers the election and intent-mirror workers and returns
// their bodies; the election's body joins its term goroutine (which
// resigns) before returning.
func (s *Server) haLoops(ctx context.Context) []func() {
	if s.ha == nil {
		return nil
	}
	h := s.ha
	h.termMu.Lock()
	h.base = ctx
	h.termMu.Unlock()
	el := s.loops.RegisterWorker(LoopHAElection, periodic.High, haStepWait, s.electionCycle)
	im := s.loops.RegisterWorker(LoopHAIntent, periodic.High, haStepWait, s.intentCycle)
	return []func(){
		func() { el.Run(ctx); h.el.Wait() },
		func() {
			im.Run(ctx)
			if h.wcancel != nil {
				h.wcancel()
			}
		},
	}
}

// closeHA closes the etcd client after every loop stopped.
func (s *Server) closeHA() {
	if s.ha != nil {
		_ = s.ha.cli.Close()
	}
}

func (s *Server) electionCycle(ctx context.Context) (periodic.Summary, error) {
	h := s.ha
	msg, err := h.el.Step(ctx, haStepWait)
	if err != nil || ctx.Err() != nil {
		return periodic.Summary{Message: msg}, err
	}
	lctx, cancel := context.WithTimeout(ctx, haStepWait)
	url, _, ok, lerr := leader.Leader(lctx, h.cli, h.election)
	cancel()
	if lerr == nil {
		if !ok {
			url = ""
		}
		h.leaderURL.Store(&url)
	}
	return periodic.Summary{Message: fmt.Sprintf("%s; leader %q", msg, url)}, nil
}

// onLeaderChange runs on the elector's goroutine: a new term gets a
// context its dispatches run under, an ended term's is cancelled.
func (s *Server) onLeaderChange(st leader.Status) {
	h := s.ha
	h.termMu.Lock()
	defer h.termMu.Unlock()
	if h.termCancel != nil {
		h.termCancel()
		h.termCtx, h.termCancel = nil, nil
	}
	if st.Leading && h.base != nil {
		h.termCtx, h.termCancel = context.WithCancel(h.base)
		s.log.Info("leading: eviction, resync, prefetch relay and intent writes enabled", "fence_revision", st.Revision)
		return
	}
	s.log.Warn("not leading: eviction dispatch stopped; intent writes go to the leader", "fence_revision", st.Revision)
}

// dispatchTerm is what an eviction cycle may act under: without HA, ctx;
// with it, the current term's context and fencing token, or ok false on a
// standby (or a leader past its renew deadline).
func (s *Server) dispatchTerm(ctx context.Context) (context.Context, int64, bool) {
	if s.ha == nil {
		return ctx, 0, true
	}
	rev, ok := s.ha.el.Fence()
	if !ok {
		return nil, 0, false
	}
	s.ha.termMu.Lock()
	tctx := s.ha.termCtx
	s.ha.termMu.Unlock()
	if tctx == nil || tctx.Err() != nil {
		return nil, 0, false
	}
	s.ha.lastFence.Store(rev)
	return tctx, rev, true
}

// mayLead reports whether leader-only work may run now (always without HA).
func (s *Server) mayLead() bool { return s.ha == nil || s.ha.el.Leading() }

// leaderOnly gates a route: a standby redirects or refuses it.
func (s *Server) leaderOnly(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.mayLead() {
			return h(w, r)
		}
		s.standbyReply(w, r)
		return nil
	}
}

// StandbyResponse is a standby's answer to a leader-only request: 307 with
// Location at the leader, or 503 with leader null while none is elected.
type StandbyResponse struct {
	Detail string  `json:"detail"`
	Leader *string `json:"leader"`
}

// leaderNow reads the leader's URL from etcd (falling back to the last one
// the election loop saw); "" when none, or when it is this coordinator
// (whose term is in transition).
func (s *Server) leaderNow(ctx context.Context) string {
	h := s.ha
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	url, _, ok, err := leader.Leader(lctx, h.cli, h.election)
	cancel()
	if err != nil {
		if p := h.leaderURL.Load(); p != nil {
			url, ok = *p, *p != ""
		}
	}
	if !ok || url == h.id {
		return ""
	}
	return url
}

func (s *Server) standbyReply(w http.ResponseWriter, r *http.Request) {
	url := s.leaderNow(r.Context())
	if url == "" {
		s.ha.redirects.WithLabelValues("no_leader").Inc()
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, StandbyResponse{Detail: "this coordinator is a standby and no leader is elected right now; retry shortly"})
		return
	}
	s.ha.redirects.WithLabelValues("redirect").Inc()
	w.Header().Set("Location", url+r.URL.RequestURI())
	writeJSON(w, http.StatusTemporaryRedirect, StandbyResponse{Detail: "this coordinator is a standby; the leader at " + url + " serves this request", Leader: &url})
}

// ReadyzResponse is GET /readyz (HA mode only).
type ReadyzResponse struct {
	Status string `json:"status" enum:"ready,not_ready"`
	Role   string `json:"role" enum:"leader,standby"`
	// Leader is the leader's advertised URL as last read from etcd (null
	// when none is elected).
	Leader *string `json:"leader"`
	// FenceRevision is the leader's term token (0 on a standby).
	FenceRevision int64 `json:"fence_revision"`
}

// handleReadyz: ready (200) only on the leader with the intent loaded;
// a standby is live (/healthz) but not ready (503), so a Kubernetes
// Service sends clients to the leader.
func (s *Server) handleReadyz(w http.ResponseWriter, _ *http.Request) error {
	h := s.ha
	out := ReadyzResponse{Status: "not_ready", Role: "standby"}
	if p := h.leaderURL.Load(); p != nil && *p != "" {
		u := *p
		out.Leader = &u
	}
	code := http.StatusServiceUnavailable
	if rev, ok := h.el.Fence(); ok {
		out.Role, out.FenceRevision = "leader", rev
		u := h.id
		out.Leader = &u
		if h.mirror.loaded.Load() {
			out.Status, code = "ready", http.StatusOK
		}
	}
	writeJSON(w, code, out)
	return nil
}

// leaderOnlyRoutes are the routes only the leader serves.
var leaderOnlyRoutes = map[string]bool{
	"PUT /quota/config": true, "PUT /quota/{cache_salt}": true, "DELETE /quota/{cache_salt}": true,
	"POST /cache/pins": true, "DELETE /cache/pins": true,
	"POST /cache/prefetches": true, "GET /cache/prefetches/{instance_id}/{request_id}": true,
}

// haRoutes gates the leader-only routes and adds GET /readyz; without HA
// it returns rts unchanged.
func (s *Server) haRoutes(rts []route) []route {
	if s.ha == nil {
		return rts
	}
	for i := range rts {
		if leaderOnlyRoutes[rts[i].Method+" "+rts[i].Path] {
			rts[i].Handle = s.leaderOnly(rts[i].Handle)
			rts[i].Statuses[http.StatusTemporaryRedirect] = "Standby: the leader's URL in Location (HA mode)"
			rts[i].Statuses[http.StatusServiceUnavailable] = "Standby with no leader elected, or the intent store did not confirm (HA mode)"
		}
	}
	return append(rts, route{Method: "GET", Path: "/readyz", Tag: "health", Summary: "Readiness: 200 on the HA leader, 503 on a standby",
		Statuses: map[int]string{200: "Leader, intent loaded", 503: "Standby (live, not ready)"}, Response: ReadyzResponse{}, Handle: s.handleReadyz})
}
