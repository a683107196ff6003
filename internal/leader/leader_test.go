package leader_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/etcdtest"
	"github.com/lmcache-go/lmcache/internal/leader"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	ttl     = 5 * time.Second
	waitFor = 60 * time.Second
	prefix  = "/test/leader"
)

// elector is one running Elector with its change feed.
type elector struct {
	e       *leader.Elector
	changes chan leader.Status
	stop    func()
}

func runElector(t *testing.T, cli *clientv3.Client, id string) *elector {
	t.Helper()
	return runElectorTTL(t, cli, id, ttl)
}

// memberLossTTL is the lease TTL of the etcd member-loss tests. They claim
// the term survives a member's (or the raft leader's) death; with the 5 s
// TTL the renew deadline is 3.3 s, and a raft election on a loaded 2-core
// CI machine once left etcd unable to renew for longer than that, ending
// the term for a reason the tests are not about.
const memberLossTTL = 10 * time.Second

func runElectorTTL(t *testing.T, cli *clientv3.Client, id string, ttl time.Duration) *elector {
	t.Helper()
	changes := make(chan leader.Status, 64)
	e, err := leader.New(leader.Config{Client: cli, ID: id, Prefix: prefix, TTL: ttl,
		OnChange: func(s leader.Status) { changes <- s }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s Run: %v", id, err)
				}
			case <-time.After(waitFor):
				t.Errorf("%s Run did not return after cancel", id)
			}
		})
	}
	t.Cleanup(stop)
	return &elector{e: e, changes: changes, stop: stop}
}

func (el *elector) next(t *testing.T, leading bool) leader.Status {
	t.Helper()
	select {
	case s := <-el.changes:
		if s.Leading != leading {
			t.Fatalf("change %+v, want Leading=%v", s, leading)
		}
		return s
	case <-time.After(waitFor):
		t.Fatalf("no change to Leading=%v before the deadline", leading)
	}
	return leader.Status{}
}

// waitKeys polls until the election prefix holds n keys.
func waitKeys(t *testing.T, cli *clientv3.Client, n int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err == nil && resp.Count == int64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("election keys: %v %v, want %d", resp, err, n)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
}

// pair starts an etcd cluster, elector A (which leads) and elector B
// (queued behind it), and returns them with A's client and first change.
type pair struct {
	c     *cluster
	admin *clientv3.Client
	cliA  *clientv3.Client
	a, b  *elector
	gainA leader.Status
}

func startPair(t *testing.T) pair {
	t.Helper()
	return startPairTTL(t, ttl)
}

// startPairTTL is startPair with electors of lease TTL ttl.
func startPairTTL(t *testing.T, ttl time.Duration) pair {
	t.Helper()
	p := pair{c: startCluster(t)}
	p.admin = newClient(t, p.c.Endpoints)
	p.cliA = newClient(t, p.c.Endpoints)
	p.a = runElectorTTL(t, p.cliA, "coord-a", ttl)
	p.gainA = p.a.next(t, true)
	if p.gainA.Revision <= 0 || !p.a.e.Leading() || p.a.e.Revision() != p.gainA.Revision {
		t.Fatalf("A: status %+v Leading %v Revision %d", p.gainA, p.a.e.Leading(), p.a.e.Revision())
	}
	p.b = runElectorTTL(t, newClient(t, p.c.Endpoints), "coord-b", ttl)
	waitKeys(t, p.admin, 2) // B is queued behind A
	if p.b.e.Leading() || p.b.e.Revision() != 0 {
		t.Fatalf("standby leads: %v rev %d", p.b.e.Leading(), p.b.e.Revision())
	}
	return p
}

// One of two electors leads; when the leader's etcd client dies (no resign),
// it stops leading before its lease expires, and the standby takes over
// once etcd expires it, with a higher fencing token.
func TestStandbyTakesOverWhenLeaderClientDies(t *testing.T) {
	p := startPair(t)
	admin, cliA, a, b, gainA := p.admin, p.cliA, p.a, p.b, p.gainA

	killed := time.Now()
	if err := cliA.Close(); err != nil {
		t.Fatal(err)
	}
	lostA := a.next(t, false)
	gainB := b.next(t, true)
	if a.e.Leading() {
		t.Error("A still Leading() after its client died")
	}
	if !lostA.At.Before(gainB.At) {
		t.Errorf("A's authority ended at %v, not before B was elected at %v", lostA.At, gainB.At)
	}
	if gainB.Revision <= gainA.Revision || b.e.Revision() != gainB.Revision {
		t.Errorf("B's fencing token %d (Revision %d) not above A's %d", gainB.Revision, b.e.Revision(), gainA.Revision)
	}
	// Everyone reads the new leader's identity and token from etcd, and
	// only B holds a fence key.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	id, rev, ok, err := leader.Leader(ctx, admin, prefix)
	cancel()
	if err != nil || !ok || id != "coord-b" || rev != gainB.Revision {
		t.Errorf("Leader() = %q %d %v %v, want coord-b %d", id, rev, ok, err, gainB.Revision)
	}
	if key, rev, ok := b.e.FenceKey(); !ok || rev != gainB.Revision || key != gainB.Key {
		t.Errorf("B FenceKey %q %d %v, want %q %d", key, rev, ok, gainB.Key, gainB.Revision)
	}
	if _, _, ok := a.e.FenceKey(); ok {
		t.Error("deposed A still has a fence key")
	}
	if got := a.e.Describe(); got != "standby" {
		t.Errorf("A Describe %q", got)
	}
	t.Logf("failover: %v from killing A's client to B elected (TTL %v); A stopped %v before B started",
		gainB.At.Sub(killed).Round(time.Millisecond), ttl, gainB.At.Sub(lostA.At).Round(time.Millisecond))

	// B resigns on cancel: its key goes at once, leaving none.
	b.stop()
	b.next(t, false)
	waitKeys(t, admin, 0)
	a.stop()
}

// A leader cut off from etcd (its process alive, its client retrying) stops
// leading at its last renewal + RenewDeadline, which is at least
// TTL - RenewDeadline before etcd can expire its lease and elect the standby.
func TestPartitionedLeaderStopsBeforeLeaseExpires(t *testing.T) {
	c := startCluster(t)
	admin := newClient(t, c.Endpoints)
	proxies, viaProxy := etcdtest.ProxyAll(t, c)
	a := runElector(t, newClient(t, viaProxy), "coord-a")
	gainA := a.next(t, true)
	b := runElector(t, newClient(t, c.Endpoints), "coord-b")
	waitKeys(t, admin, 2)

	for _, p := range proxies {
		p.Cut()
	}
	cut := time.Now() // no renewal sent after this can reach etcd
	lostA := a.next(t, false)
	gainB := b.next(t, true)
	renewDeadline := ttl * 2 / 3
	if lostA.At.After(cut.Add(renewDeadline)) {
		t.Errorf("A's authority ended %v after the cut, past its renew deadline %v", lostA.At.Sub(cut), renewDeadline)
	}
	if margin := gainB.At.Sub(lostA.At); margin < ttl-renewDeadline {
		t.Errorf("B elected %v after A stopped, want at least TTL - RenewDeadline = %v", margin, ttl-renewDeadline)
	}
	if a.e.Leading() || gainB.Revision <= gainA.Revision {
		t.Errorf("A Leading %v; revisions A %d B %d", a.e.Leading(), gainA.Revision, gainB.Revision)
	}
	t.Logf("partition: A stopped %v after the cut, B elected %v after the cut (%v after A stopped; TTL %v, renew deadline %v)",
		lostA.At.Sub(cut).Round(time.Millisecond), gainB.At.Sub(cut).Round(time.Millisecond),
		gainB.At.Sub(lostA.At).Round(time.Millisecond), ttl, renewDeadline)
}

// A leader whose election key is deleted behind its back (an operator, a
// lease revoked elsewhere) stops leading at once; the standby takes over and
// the old leader queues behind it with a new key. A cancelled standby leaves
// no key behind.
func TestLeaderStepsDownWhenItsKeyIsDeleted(t *testing.T) {
	p := startPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := p.admin.Delete(ctx, p.gainA.Key); err != nil {
		t.Fatal(err)
	}
	lostA := p.a.next(t, false)
	gainB := p.b.next(t, true)
	if lostA.Revision != p.gainA.Revision || gainB.Revision <= p.gainA.Revision {
		t.Errorf("revisions: A %d lost %d, B %d", p.gainA.Revision, lostA.Revision, gainB.Revision)
	}
	waitKeys(t, p.admin, 2) // A campaigns again, behind B
	if p.a.e.Leading() {
		t.Error("A leads again while B holds the key")
	}
	p.a.stop()
	waitKeys(t, p.admin, 1)
	if !p.b.e.Leading() {
		t.Error("B stopped leading when the standby left")
	}
}

// A standby cut off from etcd long enough for its lease to expire queues
// again with a fresh lease once it reconnects (it does not wait keyless in
// its old campaign), and takes over when the leader resigns.
func TestStandbyRequeuesAfterItsLeaseExpires(t *testing.T) {
	c := startCluster(t)
	admin := newClient(t, c.Endpoints)
	a := runElector(t, newClient(t, c.Endpoints), "coord-a")
	gainA := a.next(t, true)
	proxies, viaProxy := etcdtest.ProxyAll(t, c)
	b := runElector(t, newClient(t, viaProxy), "coord-b")
	waitKeys(t, admin, 2)
	for _, p := range proxies {
		p.Cut()
	}
	waitKeys(t, admin, 1) // B's lease expired
	for _, p := range proxies {
		p.Heal()
	}
	waitKeys(t, admin, 2) // B queued again
	a.stop()
	a.next(t, false)
	gainB := b.next(t, true)
	if gainB.Revision <= gainA.Revision || !b.e.Leading() {
		t.Errorf("B after A resigned: %+v Leading %v", gainB, b.e.Leading())
	}
}

// A leader that is cancelled resigns: the standby is elected without
// waiting for the lease TTL.
func TestLeaderResignsOnCancel(t *testing.T) {
	p := startPair(t)
	admin, a, b, gainA := p.admin, p.a, p.b, p.gainA
	resigned := time.Now()
	a.stop()
	lostA := a.next(t, false)
	gainB := b.next(t, true)
	if lostA.Revision != gainA.Revision || gainB.Revision <= gainA.Revision {
		t.Errorf("revisions: A %d/%d, B %d", gainA.Revision, lostA.Revision, gainB.Revision)
	}
	if a.e.Leading() {
		t.Error("A Leading() after resigning")
	}
	waitKeys(t, admin, 1)
	t.Logf("handover after resign: %v (TTL %v)", gainB.At.Sub(resigned).Round(time.Millisecond), ttl)
}

// Killing one of three etcd members (a raft follower) leaves leadership
// where it was: the leader keeps renewing through the remaining quorum,
// its fencing token unchanged, and the standby stays standby.
func TestLeadershipSurvivesEtcdMemberLoss(t *testing.T) {
	p := startPairTTL(t, memberLossTTL)
	survivesMemberLoss(t, p, p.c.Follower(t, p.admin), false)
}

// TestLeadershipSurvivesEtcdLeaderLoss kills the etcd cluster's raft
// leader instead: the two survivors elect a new raft leader (checked: a
// different member), etcd keeps the lease alive across its leader change,
// and the coordinator's leadership is again unchanged: same term, same
// fencing token, no second term for either elector, renewals resume.
func TestLeadershipSurvivesEtcdLeaderLoss(t *testing.T) {
	p := startPairTTL(t, memberLossTTL)
	survivesMemberLoss(t, p, p.c.Leader(t, p.admin), true)
}

func survivesMemberLoss(t *testing.T, p pair, victim *etcdtest.Member, raftLeader bool) {
	c, admin, a, b, gainA := p.c, p.admin, p.a, p.b, p.gainA
	victim.Kill(t)
	if raftLeader {
		deadline := time.Now().Add(waitFor)
		for !c.LeaderChanged(t, admin, victim) {
			if time.Now().After(deadline) {
				t.Fatalf("no new etcd leader after %s (the leader) died", victim.Name)
			}
			time.Sleep(50 * time.Millisecond) // polling interval
		}
	}
	before := a.e.Renewals()
	deadline := time.Now().Add(waitFor)
	for a.e.Renewals() < before+3 {
		if time.Now().After(deadline) {
			t.Fatalf("A renewed %d times after %s died, want 3", a.e.Renewals()-before, victim.Name)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	if !a.e.Leading() || a.e.Revision() != gainA.Revision {
		t.Errorf("A after member loss: Leading %v Revision %d, want true %d", a.e.Leading(), a.e.Revision(), gainA.Revision)
	}
	if b.e.Leading() {
		t.Error("B leads after a member loss")
	}
	select {
	case s := <-a.changes:
		t.Errorf("A changed leadership after member loss: %+v", s)
	case s := <-b.changes:
		t.Errorf("B changed leadership after member loss: %+v", s)
	default:
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.e.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := gathered(mfs)
	renewed := got["lmcache_coordinator_leader_renewals_total"]
	// Renewals through the dead member may have failed and been retried
	// (reason error, a count that depends on which member the client
	// used); the lease itself never went.
	delete(got, "lmcache_coordinator_leader_renewals_total")
	delete(got, `lmcache_coordinator_leader_renewal_failures_total{reason="error"}`)
	want := map[string]float64{"lmcache_coordinator_leader": 1, "lmcache_coordinator_leader_revision": float64(gainA.Revision),
		"lmcache_coordinator_leader_transitions_total": 1, "lmcache_coordinator_leader_elections_total": 1, "lmcache_coordinator_leader_lost_total": 0,
		`lmcache_coordinator_leader_renewal_failures_total{reason="lease_gone"}`: 0}
	if !maps.Equal(got, want) {
		t.Errorf("metrics %v, want %v", got, want)
	}
	if renewed < float64(before+3) {
		t.Errorf("renewals_total %v, want at least %d", renewed, before+3)
	}
	t.Logf("killed etcd %s; A renewed %d times since, still leader at revision %d", victim.Name, a.e.Renewals()-before, gainA.Revision)
}

func TestConfigValidation(t *testing.T) {
	cli, err := leader.NewClient([]string{"http://127.0.0.1:1"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for name, cfg := range map[string]leader.Config{
		"no client":         {ID: "a"},
		"no id":             {Client: cli},
		"ttl too short":     {Client: cli, ID: "a", TTL: time.Second},
		"fractional ttl":    {Client: cli, ID: "a", TTL: 2500 * time.Millisecond},
		"deadline over ttl": {Client: cli, ID: "a", TTL: 5 * time.Second, RenewDeadline: 5 * time.Second},
	} {
		if _, err := leader.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	e, err := leader.New(leader.Config{Client: cli, ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Leading() || e.Revision() != 0 {
		t.Error("a new elector leads before Run")
	}
	if _, err := leader.NewClient(nil, 0); err == nil {
		t.Error("NewClient accepted no endpoints")
	}
	eps, err := leader.ParseEndpoints(" http://127.0.0.1:2379, 127.0.0.2:2379 ")
	if err != nil || !slices.Equal(eps, []string{"http://127.0.0.1:2379", "127.0.0.2:2379"}) {
		t.Errorf("ParseEndpoints: %v %v", eps, err)
	}
	for _, bad := range []string{"", " ", "a:1,,b:2"} {
		if _, err := leader.ParseEndpoints(bad); err == nil {
			t.Errorf("ParseEndpoints(%q) accepted", bad)
		}
	}
}

// gathered flattens gathered families to name{label="value"} -> value.
func gathered(mfs []*dto.MetricFamily) map[string]float64 {
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += fmt.Sprintf("{%s=%q}", l.GetName(), l.GetValue())
			}
			got[name] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return got
}

// TestRenewalLoopInRegistryCountsFailures: the renewal loop is listed in
// the registry given as Config.Loops under Config.RenewLoopName (high
// level, running while the elector holds a lease). When etcd is cut off,
// every failed renewal is one failed run of that loop and one
// renewal_failures_total{reason="error"}: the two agree exactly once the
// term has ended and the loop stopped, and the lease was never reported
// gone (etcd was unreachable, not forgetful).
func TestRenewalLoopInRegistryCountsFailures(t *testing.T) {
	c := etcdtest.Start(t, 1)
	proxies, viaProxy := etcdtest.ProxyAll(t, c)
	reg := periodic.NewRegistry()
	changes := make(chan leader.Status, 64)
	e, err := leader.New(leader.Config{Client: newClient(t, viaProxy), ID: "coord-a", Prefix: prefix, TTL: ttl,
		Loops: reg, RenewLoopName: "test-renewal", OnChange: func(s leader.Status) { changes <- s }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	el := &elector{e: e, changes: changes}
	el.next(t, true)
	loop := func() periodic.Status {
		for _, st := range reg.All() {
			if st.Name == "test-renewal" {
				return st
			}
		}
		t.Fatalf("registry lacks the renewal loop: %+v", reg.All())
		return periodic.Status{}
	}
	deadline := time.Now().Add(waitFor)
	for e.Renewals() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("renewals %d, want 2", e.Renewals())
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	if st := loop(); !st.IsRunning || st.Level != periodic.High || st.FailedRuns != 0 || st.TotalRuns < 2 {
		t.Fatalf("renewal loop while renewing: %+v", st)
	}
	for _, p := range proxies {
		p.Cut()
	}
	el.next(t, false)
	deadline = time.Now().Add(waitFor)
	for loop().IsRunning { // the term's loop stops once the term is over
		if time.Now().After(deadline) {
			t.Fatal("renewal loop still running after the term ended")
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	reg2 := prometheus.NewPedanticRegistry()
	reg2.MustRegister(e.Collectors()...)
	mfs, err := reg2.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := gathered(mfs)
	st := loop()
	if st.FailedRuns < 1 || got[`lmcache_coordinator_leader_renewal_failures_total{reason="error"}`] != float64(st.FailedRuns) {
		t.Errorf("failed runs %d, renewal_failures_total{error} %v: want equal and at least 1", st.FailedRuns,
			got[`lmcache_coordinator_leader_renewal_failures_total{reason="error"}`])
	}
	if g := got[`lmcache_coordinator_leader_renewal_failures_total{reason="lease_gone"}`]; g != 0 {
		t.Errorf("lease_gone %v, want 0", g)
	}
	if g := got["lmcache_coordinator_leader_renewals_total"]; g != float64(e.Renewals()) || g < 2 {
		t.Errorf("renewals_total %v, Renewals() %d", g, e.Renewals())
	}
	if msg, _ := st.LastSummary["message"].(string); !strings.Contains(msg, "renew lease") && msg != "stopping" {
		t.Errorf("last summary %q", msg)
	}
}
