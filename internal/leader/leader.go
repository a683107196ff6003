// Package leader elects one active coordinator among several (active/standby)
// on an etcd lease, with go.etcd.io/etcd/client/v3's concurrency election.
//
// A leader's authority is bounded in time, not just by etcd's verdict: every
// successful lease renewal, sent at t, makes Leading() true until
// t + RenewDeadline, and RenewDeadline < TTL. etcd cannot expire the lease
// before t + TTL (the server starts the TTL no earlier than it received the
// renewal), so a leader that cannot renew stops acting at least
// TTL - RenewDeadline before any standby can be elected. The election key's
// create revision is the fencing token: it grows with every new leader, so
// it goes into every action the leader takes (eviction dispatch logs and
// metrics) and a stale one is recognisable.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/lmcache-go/lmcache/internal/periodic"
)

// Defaults.
const (
	// DefaultPrefix is the election's key prefix.
	DefaultPrefix = "/lmcache/coordinator/leader"
	// DefaultTTL is the lease TTL.
	DefaultTTL = 10 * time.Second
	// MinTTL is the shortest TTL accepted (etcd rounds leases up to about
	// 1.5 election timeouts; below 2 s a renewal has no slack).
	MinTTL = 2 * time.Second
	// DefaultDialTimeout bounds NewClient's first connection.
	DefaultDialTimeout = 5 * time.Second
	// DefaultRenewLoopName is the lease-renewal loop's name in the
	// periodic registry when Config.RenewLoopName is empty.
	DefaultRenewLoopName = "leader-lease-renewal"
)

// Reasons of lmcache_coordinator_leader_renewal_failures_total.
const (
	// RenewFailError is a renewal that did not get an answer (etcd
	// unreachable, timeout); the next tick retries, and the term ends at
	// its renew deadline if none succeeds.
	RenewFailError = "error"
	// RenewFailLeaseGone is a renewal etcd answered with the lease
	// unknown (expired or revoked): the term ends at once.
	RenewFailLeaseGone = "lease_gone"
)

// Config configures an Elector.
type Config struct {
	// Client is the etcd client, owned by the caller (closed after Run
	// returns).
	Client *clientv3.Client
	// ID is stored as the election value: this coordinator's identity.
	ID string
	// Prefix defaults to DefaultPrefix.
	Prefix string
	// TTL is the lease TTL, whole seconds, at least MinTTL; DefaultTTL if 0.
	TTL time.Duration
	// RenewDeadline is how long a renewal keeps Leading() true; it must be
	// below TTL. Default: two thirds of TTL. Renewals are sent every
	// RenewDeadline/3.
	RenewDeadline time.Duration
	// OnChange, if set, is called from Run's goroutine on every change of
	// leadership, in order. It must return quickly.
	OnChange func(Status)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Loops, if set, lists the lease-renewal loop in this registry (the
	// coordinator's /periodic-threads and periodic_thread_* metrics), so a
	// stuck or failing renewal is visible there; nil uses a private one.
	Loops *periodic.Registry
	// RenewLoopName is the renewal loop's name; DefaultRenewLoopName if
	// empty.
	RenewLoopName string
}

// Status is a leadership change.
type Status struct {
	Leading bool
	// Revision is the fencing token of the term that began or ended.
	Revision int64
	// Key is the election key of that term.
	Key string
	// At is when the change took effect. For a lost term it is the moment
	// Leading() turned false (the renew deadline), which may precede the
	// callback.
	At time.Time
}

// Elector campaigns for leadership and holds it while its lease renews.
type Elector struct {
	cfg Config
	log *slog.Logger

	mu         sync.Mutex
	leading    bool
	rev        int64
	key        string
	validUntil time.Time // last renewal sent + RenewDeadline

	renewals atomic.Int64
	// renewFailures counts failed renewals by reason (RenewFail*): a
	// failure is work the elector could not do, so it is a metric, not
	// only a log line.
	renewFailures *prometheus.CounterVec
	// renewLoop runs each term's renewals (one Run per term, on the term's
	// renew goroutine). cur is that term's lease, set by renew before
	// the loop runs and read only by the loop's cycles on that goroutine.
	renewLoop   *periodic.Loop
	cur         *renewTerm
	transitions atomic.Int64
	elections   atomic.Int64 // terms won
	lost        atomic.Int64 // terms ended other than by resigning

	// Step's state, touched only by the goroutine calling Step.
	termDone chan error
	retryAt  time.Time
	termWG   sync.WaitGroup
}

var errLost = errors.New("leadership lost")

// whyResigned is stepDown's reason at shutdown (not counted as lost).
const whyResigned = "resigned"

var rpcLeaseNotFound = rpctypes.ErrLeaseNotFound

// ParseEndpoints splits a comma-separated endpoint list (the form a
// --ha-etcd-endpoints flag takes), refusing an empty list or element.
func ParseEndpoints(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("leader: etcd endpoints must be non-empty")
	}
	var out []string
	for _, ep := range strings.Split(s, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			return nil, fmt.Errorf("leader: etcd endpoints %q has an empty element", s)
		}
		out = append(out, ep)
	}
	return out, nil
}

// NewClient connects an etcd client with the given endpoints, logging
// through a no-op zap logger (the Elector logs what matters through slog).
func NewClient(endpoints []string, dialTimeout time.Duration) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("leader: no etcd endpoints")
	}
	if dialTimeout <= 0 {
		dialTimeout = DefaultDialTimeout
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: dialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("leader: etcd client: %w", err)
	}
	return cli, nil
}

// New validates cfg.
func New(cfg Config) (*Elector, error) {
	if cfg.Client == nil {
		return nil, errors.New("leader: Config.Client is required")
	}
	if cfg.ID == "" {
		return nil, errors.New("leader: Config.ID is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < MinTTL || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("leader: TTL %v must be whole seconds and at least %v", cfg.TTL, MinTTL)
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = cfg.TTL * 2 / 3
	}
	if cfg.RenewDeadline <= 0 || cfg.RenewDeadline >= cfg.TTL {
		return nil, fmt.Errorf("leader: RenewDeadline %v must be positive and below TTL %v", cfg.RenewDeadline, cfg.TTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Loops == nil {
		cfg.Loops = periodic.NewRegistry()
	}
	if cfg.RenewLoopName == "" {
		cfg.RenewLoopName = DefaultRenewLoopName
	}
	e := &Elector{cfg: cfg, log: cfg.Logger}
	e.renewFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lmcache_coordinator_leader_renewal_failures_total",
		Help: "Lease renewals that failed, by reason: error (no answer from etcd; retried at the next tick, the term ends at its renew deadline if none succeeds) or lease_gone (etcd no longer knows the lease: the term ends at once)."},
		[]string{"reason"})
	e.renewFailures.WithLabelValues(RenewFailError)
	e.renewFailures.WithLabelValues(RenewFailLeaseGone)
	// A worker loop: its cycle waits for the term's ticker itself, so a
	// slow renewal is followed at once by the next tick (a sleep after
	// each cycle would push the next send past the renew deadline).
	e.renewLoop = cfg.Loops.RegisterWorker(cfg.RenewLoopName, periodic.High, cfg.RenewDeadline/3, e.renewCycle)
	return e, nil
}

// Leading reports whether this elector may act as leader now. It turns false
// by itself once the last renewal is RenewDeadline old, before the lease can
// expire.
func (e *Elector) Leading() bool {
	_, ok := e.Fence()
	return ok
}

// Fence returns the current term's fencing token and whether this elector is
// leading; a caller stamps the token on an action it takes only when ok.
func (e *Elector) Fence() (revision int64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading || !time.Now().Before(e.validUntil) {
		return 0, false
	}
	return e.rev, true
}

// FenceKey is Fence with the term's election key, for a write that must
// only land while this term holds: compare the key's create revision with
// the token in the same etcd transaction.
func (e *Elector) FenceKey() (key string, revision int64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading || !time.Now().Before(e.validUntil) {
		return "", 0, false
	}
	return e.key, e.rev, true
}

// Leader reads the current leader's election value (its ID) and fencing
// token from etcd: the oldest key under the prefix, as the election orders
// campaigners. ok is false when nobody campaigns.
func Leader(ctx context.Context, cli *clientv3.Client, prefix string) (id string, revision int64, ok bool, err error) {
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", 0, false, fmt.Errorf("leader: read election: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false, nil
	}
	kv := resp.Kvs[0]
	return string(kv.Value), kv.CreateRevision, true, nil
}

// Revision is the fencing token while leading, 0 otherwise.
func (e *Elector) Revision() int64 {
	rev, _ := e.Fence()
	return rev
}

// Renewals counts successful lease renewals.
func (e *Elector) Renewals() int64 { return e.renewals.Load() }

// Collectors exposes leadership as Prometheus metrics for the caller to
// register.
func (e *Elector) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lmcache_coordinator_leader",
			Help: "1 while this coordinator holds the etcd leadership lease and may dispatch, else 0."},
			func() float64 {
				if e.Leading() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lmcache_coordinator_leader_revision",
			Help: "Fencing token (etcd create revision of the election key) of the current term, 0 when not leading."},
			func() float64 { return float64(e.Revision()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lmcache_coordinator_leader_transitions_total",
			Help: "Times this coordinator became or stopped being leader."},
			func() float64 { return float64(e.transitions.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lmcache_coordinator_leader_elections_total",
			Help: "Leadership terms this coordinator won."},
			func() float64 { return float64(e.elections.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lmcache_coordinator_leader_lost_total",
			Help: "Leadership terms that ended other than by resigning at shutdown (lease lost, renew deadline passed, key deleted)."},
			func() float64 { return float64(e.lost.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lmcache_coordinator_leader_renewals_total",
			Help: "Successful lease renewals (a leader's and a queued standby's lease alike)."},
			func() float64 { return float64(e.renewals.Load()) }),
		e.renewFailures,
	}
}

// Describe is Step's one-line state for a periodic-loop summary.
func (e *Elector) Describe() string {
	if rev, ok := e.Fence(); ok {
		return fmt.Sprintf("leading revision=%d", rev)
	}
	return "standby"
}

// Step is one cycle of Run for a caller that drives the election from its
// own worker loop (the coordinator's periodic registry): it starts a term
// when none runs, then waits at most wait for it to end. A term that ends
// while ctx is live is returned as an error, and the next term starts after
// a backoff. Step must be called from one goroutine; the term it starts
// runs on a goroutine the Elector owns until ctx is cancelled, which Wait
// joins.
func (e *Elector) Step(ctx context.Context, wait time.Duration) (string, error) {
	if ctx.Err() != nil {
		return "stopping", nil
	}
	if e.termDone == nil {
		if d := time.Until(e.retryAt); d > 0 {
			if !sleepCtx(ctx, min(d, wait)) {
				return "stopping", nil
			}
			return "backing off before campaigning again", nil
		}
		ch := make(chan error, 1)
		e.termDone = ch
		e.termWG.Add(1)
		go func() { // owned by the Elector; stops with ctx
			defer e.termWG.Done()
			ch <- e.term(ctx)
		}()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-e.termDone:
		e.termDone = nil
		if ctx.Err() != nil {
			return "stopped", nil
		}
		e.retryAt = time.Now().Add(min(e.cfg.TTL/4, time.Second))
		e.log.Warn("leader election term ended; campaigning again", "id", e.cfg.ID, "err", err)
		return "", fmt.Errorf("leader: term ended: %w", err)
	case <-t.C:
		return e.Describe(), nil
	case <-ctx.Done():
		return "stopping", nil
	}
}

// Wait blocks until the term goroutine Step started has returned (after
// Step's ctx is cancelled it resigns first).
func (e *Elector) Wait() { e.termWG.Wait() }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Run campaigns until ctx is cancelled, holding leadership while the lease
// renews and campaigning again after a loss. On cancellation a leader
// resigns (its key is deleted, so a standby takes over at once) and Run
// returns nil.
func (e *Elector) Run(ctx context.Context) error {
	defer e.Wait()
	for ctx.Err() == nil {
		_, _ = e.Step(ctx, e.cfg.TTL)
	}
	return nil
}

// term runs one lease: grant, campaign, hold until lost or ctx ends.
func (e *Elector) term(ctx context.Context) error {
	cli := e.cfg.Client
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()

	sent := time.Now()
	gctx, gcancel := context.WithTimeout(tctx, e.cfg.RenewDeadline)
	grant, err := cli.Grant(gctx, int64(e.cfg.TTL/time.Second))
	gcancel()
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	lease := grant.ID
	e.mu.Lock()
	e.validUntil = sent.Add(e.cfg.RenewDeadline) // validity is per lease
	e.mu.Unlock()
	// Revoke on every way out: a resigning or demoted leader's key goes
	// with its lease, and a standby's queued key stops blocking nobody.
	defer e.revoke(lease)

	sess, err := concurrency.NewSession(cli, concurrency.WithLease(lease), concurrency.WithContext(tctx))
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	// A standby whose lease dies while queued abandons the campaign at once
	// and queues again with a fresh lease, rather than waiting keyless.
	cctx, ccancel := context.WithCancel(tctx)
	defer ccancel()
	lost := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // owned by this term; stops with tctx
		defer wg.Done()
		e.renew(tctx, lease, lost, ccancel)
	}()
	go func() { // owned by this term; stops with cctx
		defer wg.Done()
		select {
		case <-sess.Done():
			ccancel()
		case <-cctx.Done():
		}
	}()
	defer wg.Wait()
	defer cancel()

	rev, key, err := e.campaign(cctx, lease)
	if err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			return fmt.Errorf("campaign abandoned, lease %x lost: %w", lease, errLost)
		}
		return fmt.Errorf("campaign: %w", err)
	}
	// The key's create revision can be long compacted by now (a standby
	// queued for hours), so the watch below cannot start there: read the
	// key at the current revision, proving it is still ours, and watch
	// from just after that read. A delete at any revision after it is then
	// seen; one before it is seen here.
	watchFrom, err := e.confirmKey(cctx, key, rev)
	if err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			return fmt.Errorf("elected, lease %x lost: %w", lease, errLost)
		}
		return err
	}
	elect := concurrency.ResumeElection(sess, e.cfg.Prefix+"/", key, rev)
	if !e.become(rev, key) {
		// The renew deadline passed while campaigning: the lease may be
		// about to expire, so this term never acts.
		return fmt.Errorf("elected at revision %d after the renew deadline: %w", rev, errLost)
	}
	e.log.Info("became leader", "id", e.cfg.ID, "revision", rev, "key", key)

	stopWatch := func() {}
	defer func() { stopWatch() }()
	watch := func(from int64) clientv3.WatchChan { // ends the previous watch
		stopWatch()
		wctx, wcancel := context.WithCancel(tctx)
		stopWatch = wcancel
		return cli.Watch(wctx, key, clientv3.WithRev(from))
	}
	wch := watch(watchFrom)
	for {
		e.mu.Lock()
		wait := time.Until(e.validUntil)
		e.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			e.stepDown(whyResigned, time.Now())
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RenewDeadline)
			if err := elect.Resign(rctx); err != nil {
				e.log.Warn("resign failed; the lease expires instead", "id", e.cfg.ID, "err", err)
			}
			rcancel()
			return nil
		case err := <-lost:
			timer.Stop()
			e.stepDown("lease lost", time.Now())
			return err
		case <-sess.Done():
			timer.Stop()
			e.stepDown("session ended", time.Now())
			return fmt.Errorf("etcd session ended: %w", errLost)
		case wr, ok := <-wch:
			timer.Stop()
			if ok && wr.CompactRevision != 0 {
				// A quiet key's watch resumes, after a reconnect, from
				// the revision it started at, which etcd may have
				// compacted since. Compaction deletes nothing: the key
				// still there with this term's create revision was never
				// deleted (a re-created key has a new one), so confirm
				// it and watch again from now.
				from, err := e.confirmKey(tctx, key, rev)
				if err != nil {
					e.stepDown("election key unconfirmable after a compacted watch", time.Now())
					if !errors.Is(err, errLost) {
						err = fmt.Errorf("%w (%w)", errLost, err)
					}
					return err
				}
				e.log.Info("election key watch compacted; key confirmed, watching again", "id", e.cfg.ID, "revision", rev, "compacted", wr.CompactRevision, "from", from)
				wch = watch(from)
				continue
			}
			if !ok || wr.Err() != nil || hasDelete(wr) {
				e.stepDown("election key gone or unwatchable", time.Now())
				return fmt.Errorf("election key %s deleted or watch failed: %w", key, errLost)
			}
		case <-timer.C:
			e.mu.Lock()
			expired := !time.Now().Before(e.validUntil)
			at := e.validUntil
			e.mu.Unlock()
			if expired {
				e.stepDown("renew deadline passed", at)
				return fmt.Errorf("no lease renewal within %v: %w", e.cfg.RenewDeadline, errLost)
			}
		}
	}
}

// campaign queues this lease's key under the prefix and waits until every
// older key is gone, as concurrency.Election.Campaign does, but without its
// cleanup: Election.Campaign, cancelled while queued, resigns with the
// client's own context (no deadline; etcd's client waits for a ready
// connection), so with etcd unreachable a cancelled campaign never
// returned and shutdown hung until the client was closed. Here nothing
// needs cleaning up: the key is on the term's lease, which term revokes
// (bounded) on its way out. Returns the key and its create revision.
func (e *Elector) campaign(ctx context.Context, lease clientv3.LeaseID) (rev int64, key string, err error) {
	cli := e.cfg.Client
	key = fmt.Sprintf("%s/%x", e.cfg.Prefix, lease)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, e.cfg.ID, clientv3.WithLease(lease))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return 0, "", fmt.Errorf("queue election key: %w", err)
	}
	rev = resp.Header.Revision
	if !resp.Succeeded {
		// The key is this term's fresh lease's, so it cannot predate the
		// term; a retried commit that landed is the only way here.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return 0, "", fmt.Errorf("election key %s vanished", key)
		}
		rev = kvs[0].CreateRevision
	}
	// Wait for every key created before ours, newest first.
	opts := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))
	for {
		gr, err := cli.Get(ctx, e.cfg.Prefix+"/", opts...)
		if err != nil {
			return 0, "", fmt.Errorf("read election queue: %w", err)
		}
		if len(gr.Kvs) == 0 {
			return rev, key, nil
		}
		if err := waitDelete(ctx, cli, string(gr.Kvs[0].Key), gr.Header.Revision); err != nil {
			return 0, "", err
		}
	}
}

// confirmKey reads the elected key (bounded by RenewDeadline) and returns
// the revision to watch it from: one past the read. It fails with errLost
// when the key is gone or is no longer the one created at rev.
func (e *Elector) confirmKey(ctx context.Context, key string, rev int64) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
	defer cancel()
	resp, err := e.cfg.Client.Get(gctx, key)
	if err != nil {
		return 0, fmt.Errorf("read election key %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev {
		return 0, fmt.Errorf("election key %s deleted before the term began: %w", key, errLost)
	}
	return resp.Header.Revision + 1, nil
}

// waitDelete waits until key is deleted after revision rev.
func waitDelete(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wr clientv3.WatchResponse
	for wr = range cli.Watch(wctx, key, clientv3.WithRev(rev)) {
		if hasDelete(wr) {
			return nil
		}
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("watch %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("wait for %s: %w", key, err)
	}
	return fmt.Errorf("watch on %s ended", key)
}

func hasDelete(wr clientv3.WatchResponse) bool {
	for _, ev := range wr.Events {
		if ev.Type == clientv3.EventTypeDelete {
			return true
		}
	}
	return false
}

// renewTerm is one term's lease as the renewal loop sees it.
type renewTerm struct {
	lease clientv3.LeaseID
	lost  chan<- error
	abort func()
	tick  <-chan time.Time
}

// renew runs the renewal loop for one term until ctx ends or the lease is
// gone: a renewal every RenewDeadline/3, each success extending validity
// to its send time + RenewDeadline. A lease etcd no longer knows is
// reported on lost, and abort is called (it ends a pending campaign).
func (e *Elector) renew(ctx context.Context, lease clientv3.LeaseID, lost chan<- error, abort func()) {
	t := time.NewTicker(e.cfg.RenewDeadline / 3)
	defer t.Stop()
	e.cur = &renewTerm{lease: lease, lost: lost, abort: abort, tick: t.C}
	e.renewLoop.Run(ctx)
}

// renewCycle is one cycle of the renewal loop: wait for the tick, renew.
func (e *Elector) renewCycle(ctx context.Context) (periodic.Summary, error) {
	rt := e.cur
	select {
	case <-ctx.Done():
		return periodic.Summary{Message: "stopping"}, nil
	case <-rt.tick:
	}
	return e.renewOnce(ctx, rt)
}

// renewOnce sends one renewal and counts its outcome. A lease etcd no
// longer knows ends the loop (periodic.ErrIrrecoverable): the term is over.
func (e *Elector) renewOnce(ctx context.Context, rt *renewTerm) (periodic.Summary, error) {
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline/3)
	resp, err := e.cfg.Client.KeepAliveOnce(rctx, rt.lease)
	cancel()
	switch {
	case err == nil && resp.TTL > 0:
		e.setValid(sent)
		e.renewals.Add(1)
		return periodic.Summary{Message: fmt.Sprintf("lease %x renewed (ttl %ds)", rt.lease, resp.TTL)}, nil
	case err == nil || errors.Is(err, rpcLeaseNotFound):
		e.renewFailures.WithLabelValues(RenewFailLeaseGone).Inc()
		select {
		case rt.lost <- fmt.Errorf("lease %x expired: %w", rt.lease, errLost):
		default:
		}
		rt.abort()
		return periodic.Summary{}, fmt.Errorf("lease %x gone (%w): %w", rt.lease, errLost, periodic.ErrIrrecoverable)
	case ctx.Err() != nil:
		// The term ended while the renewal was in flight: nothing failed.
		return periodic.Summary{Message: "stopping"}, nil
	default:
		e.renewFailures.WithLabelValues(RenewFailError).Inc()
		e.log.Warn("lease renewal failed", "id", e.cfg.ID, "err", err)
		return periodic.Summary{}, fmt.Errorf("renew lease %x: %w", rt.lease, err)
	}
}

func (e *Elector) setValid(sent time.Time) {
	e.mu.Lock()
	if v := sent.Add(e.cfg.RenewDeadline); v.After(e.validUntil) {
		e.validUntil = v
	}
	e.mu.Unlock()
}

// become starts a term unless the renew deadline already passed.
func (e *Elector) become(rev int64, key string) bool {
	e.mu.Lock()
	now := time.Now()
	if !now.Before(e.validUntil) {
		e.mu.Unlock()
		return false
	}
	e.leading, e.rev, e.key = true, rev, key
	e.mu.Unlock()
	e.transitions.Add(1)
	e.elections.Add(1)
	e.notify(Status{Leading: true, Revision: rev, Key: key, At: now})
	return true
}

// stepDown ends the term; at is when its authority ended.
func (e *Elector) stepDown(why string, at time.Time) {
	e.mu.Lock()
	if !e.leading {
		e.mu.Unlock()
		return
	}
	rev, key := e.rev, e.key
	e.leading = false
	if at.After(e.validUntil) {
		at = e.validUntil
	}
	e.mu.Unlock()
	e.transitions.Add(1)
	if why != whyResigned {
		e.lost.Add(1)
	}
	e.log.Warn("stopped leading", "id", e.cfg.ID, "revision", rev, "why", why)
	e.notify(Status{Leading: false, Revision: rev, Key: key, At: at})
}

func (e *Elector) notify(s Status) {
	if e.cfg.OnChange != nil {
		e.cfg.OnChange(s)
	}
}

// revoke drops the lease (and with it the election key), best effort: if
// etcd is unreachable the lease simply expires.
func (e *Elector) revoke(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	if _, err := e.cfg.Client.Revoke(ctx, lease); err != nil && !errors.Is(err, rpcLeaseNotFound) {
		e.log.Debug("lease revoke failed; it will expire", "id", e.cfg.ID, "err", err)
	}
}
