package coordinator_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/etcdtest"
	"github.com/lmcache-go/lmcache/internal/logtest"
)

// startHA runs a coordinator in HA mode on a listener opened first, so its
// advertised URL is its real address.
func startHA(t *testing.T, endpoints []string, mutate func(*config.Config)) *coord {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.HA.EtcdEndpoints = strings.Join(endpoints, ",")
	cfg.HA.LeaseTTL = 2
	cfg.HA.AdvertiseURL = "http://" + ln.Addr().String()
	cfg.HA.EtcdPrefix = "/test/ha/"
	if mutate != nil {
		mutate(&cfg)
	}
	logs := &logtest.Buffer{}
	srv, err := coordinator.New(cfg, coordinator.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	c := serveOn(t, srv, ln)
	c.logs = logs
	return c
}

// noFollow does one request without following redirects.
func (c *coord) noFollow(method, path string, body string) (int, http.Header, map[string]any) {
	c.t.Helper()
	cl := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer cl.CloseIdleConnections()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := cl.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, resp.Header, out
}

func (c *coord) readyz() (int, map[string]any) {
	c.t.Helper()
	code, raw := c.do("GET", "/readyz", nil)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatalf("readyz %d %s", code, raw)
	}
	return code, out
}

// metric reads one unlabelled sample from /metrics.
func (c *coord) metric(name string) float64 {
	c.t.Helper()
	_, raw := c.do("GET", "/metrics", nil)
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				c.t.Fatal(err)
			}
			return v
		}
	}
	c.t.Fatalf("metric %s not exported", name)
	return 0
}

func storeEvents(salt string, from, n, size int) []map[string]any {
	var evs []map[string]any
	for i := from; i < from+n; i++ {
		evs = append(evs, ev("store", fmt.Sprintf("%064x", i), salt, size))
	}
	return evs
}

// TestHAStandbyRedirectsAndFailover: two coordinators on a real
// three-member etcd cluster. The first leads (ready, evicts with its fence
// revision in the dispatch log and gauge); the standby is live but not
// ready, redirects intent writes and the prefetch relay with 307 to the
// leader, mirrors the quota and pins the leader commits to etcd, and never
// dispatches. When the leader stops, the standby leads with a higher fence
// revision, has the intent at once and evicts.
func TestHAStandbyRedirectsAndFailover(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	mp := newMP(t)
	fast := func(c *config.Config) {
		c.EvictionCheckInterval, c.InflightTTL = 0.1, 0
		c.EnableStartupResync, c.ResyncPollInterval = true, 0.1
	}
	a := startHA(t, cl.Endpoints, fast)
	waitFor(t, "A ready", func() bool { code, _ := a.readyz(); return code == 200 })
	b := startHA(t, cl.Endpoints, fast)
	waitFor(t, "B sees A lead", func() bool {
		code, r := b.readyz()
		return code == 503 && r["role"] == "standby" && r["leader"] == a.base
	})
	_, ra := a.readyz()
	revA := ra["fence_revision"].(float64)
	if ra["role"] != "leader" || ra["status"] != "ready" || revA <= 0 {
		t.Fatalf("A readyz %v", ra)
	}
	if code, _ := b.do("GET", "/healthz", nil); code != 200 {
		t.Fatalf("standby /healthz %d", code)
	}

	// Intent writes on the standby are redirected to the leader.
	code, hdr, body := b.noFollow("PUT", "/quota/t1", `{"limit_gb": 0.0009765625}`)
	if code != 307 || hdr.Get("Location") != a.base+"/quota/t1" || body["leader"] != a.base {
		t.Fatalf("standby PUT: %d %v %v", code, hdr.Get("Location"), body)
	}
	for _, rt := range [][2]string{{"PUT", "/quota/config"}, {"DELETE", "/quota/t1"}, {"POST", "/cache/pins"}, {"DELETE", "/cache/pins"},
		{"POST", "/cache/prefetches"}, {"GET", "/cache/prefetches/mp-1/r1"}} {
		if code, hdr, _ := b.noFollow(rt[0], rt[1], "{}"); code != 307 || !strings.HasPrefix(hdr.Get("Location"), a.base+"/") {
			t.Errorf("standby %s %s: %d %q", rt[0], rt[1], code, hdr.Get("Location"))
		}
	}
	// A 307 names where to go; it carries no Retry-After (the 503 does).
	if hdr.Get("Retry-After") != "" {
		t.Errorf("307 Retry-After %q, want none", hdr.Get("Retry-After"))
	}
	if got := b.metric(`lmcache_coordinator_standby_redirects_total{result="redirect"}`); got != 7 {
		t.Errorf("standby_redirects_total{redirect} %v, want 7", got)
	}
	if got := b.metric(`lmcache_coordinator_standby_redirects_total{result="no_leader"}`); got != 0 {
		t.Errorf("standby_redirects_total{no_leader} %v, want 0", got)
	}
	// A client that follows the redirect lands on the leader (307 keeps
	// the method and body); the quota is committed to etcd and mirrored.
	b.must("PUT", "/quota/t1", map[string]any{"limit_gb": 0.0009765625}, 200)
	a.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 2}, 200)
	pin := map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "cache_salt": "t1"}
	a.must("POST", "/cache/pins", pin, 200)
	waitFor(t, "B mirrors the quota, default and pins", func() bool {
		q := b.must("GET", "/quota/t1", nil, 200)
		d := b.must("GET", "/quota/config", nil, 200)
		return q["quota_exists"] == true && q["quota_limit_gb"] == 0.0009765625 && d["default_limit_gb"] == 2.0 && b.metric("lmcache_coordinator_active_pins") == 2
	})
	if got := a.metric("lmcache_coordinator_active_pins"); got != 2 {
		t.Fatalf("leader active pins %v", got)
	}

	// Both ingest the same events; only the leader evicts.
	mp.register(a, "mp-1")
	mp.register(b, "mp-1")
	a.events(storeEvents("t1", 0, 10, 200000)...)
	b.events(storeEvents("t1", 0, 10, 200000)...)
	waitFor(t, "A dispatches", func() bool { return len(mp.deleteBatches()) > 0 })
	// Only the leader resynced (its one listing; the fake's empty page
	// list answers 503, which ends it); the standby's resync loop waits.
	waitFor(t, "the standby's resync loop to report standby", func() bool {
		_, raw := b.do("GET", "/periodic-threads/"+coordinator.LoopResync, nil)
		return strings.Contains(string(raw), "standby: resync runs once this coordinator leads")
	})
	// The leader's one listing may come after its first dispatch.
	waitFor(t, "the leader's resync listing", func() bool { return mp.listCount() >= 1 })
	if n := mp.listCount(); n != 1 {
		t.Fatalf("%d resync listings before failover, want the leader's 1", n)
	}
	if !a.logs.Has("fence_revision=" + strconv.Itoa(int(revA))) {
		t.Errorf("A's dispatch log lacks fence_revision=%d", int(revA))
	}
	if got := a.metric("lmcache_coordinator_eviction_dispatch_fence_revision"); got != revA {
		t.Errorf("A fence gauge %v, want %v", got, revA)
	}
	if got := b.metric("lmcache_coordinator_eviction_cycles_total"); got != 0 {
		t.Errorf("standby ran %v eviction cycles", got)
	}
	if b.metric("lmcache_coordinator_leader") != 0 || a.metric("lmcache_coordinator_leader") != 1 {
		t.Error("leader gauges wrong")
	}

	// The leader stops (resigns): the standby leads at once with the
	// intent it mirrored, and evicts under its own higher fence.
	a.stop()
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B leads", func() bool { code, _ := b.readyz(); return code == 200 })
	_, rb := b.readyz()
	revB := rb["fence_revision"].(float64)
	if rb["role"] != "leader" || rb["leader"] != b.base || revB <= revA {
		t.Fatalf("B readyz %v (A's revision %v)", rb, revA)
	}
	if q := b.must("GET", "/quota/t1", nil, 200); q["quota_limit_gb"] != 0.0009765625 {
		t.Fatalf("B lost the quota: %v", q)
	}
	before := len(mp.deleteBatches())
	waitFor(t, "B dispatches", func() bool { return len(mp.deleteBatches()) > before })
	waitFor(t, "B resyncs once it leads", func() bool { return mp.listCount() == 2 })
	if got := b.metric("lmcache_coordinator_eviction_dispatch_fence_revision"); got != revB {
		t.Errorf("B fence gauge %v, want %v", got, revB)
	}
	if !b.logs.Has("fence_revision=" + strconv.Itoa(int(revB))) {
		t.Errorf("B's dispatch log lacks fence_revision=%d", int(revB))
	}
	if got := b.metric("lmcache_coordinator_leader_elections_total"); got != 1 {
		t.Errorf("B elections %v", got)
	}
	if got := b.metric("lmcache_coordinator_leader_transitions_total"); got != 1 {
		t.Errorf("B transitions %v, want 1", got)
	}
	// B renewed its lease as a standby and as leader; the renewals are
	// exported next to the election metrics.
	if got := b.metric("lmcache_coordinator_leader_renewals_total"); got < 1 {
		t.Errorf("B renewals_total %v, want at least 1", got)
	}
	// Now B accepts writes itself, and unpins.
	b.must("DELETE", "/cache/pins", pin, 200)
	if got := b.metric("lmcache_coordinator_active_pins"); got != 0 {
		t.Errorf("B active pins after unpin %v", got)
	}
	if _, raw := b.do("GET", "/periodic-threads", nil); !strings.Contains(string(raw), coordinator.LoopHAElection) || !strings.Contains(string(raw), coordinator.LoopHAIntent) ||
		!strings.Contains(string(raw), coordinator.LoopHALease) {
		t.Errorf("/periodic-threads lacks the HA loops: %s", raw)
	}
}

// TestHANoEtcdRefusesWithClearStatus: a coordinator whose etcd is
// unreachable never leads: it stays live on /healthz, is not ready, and
// answers intent writes 503 with a JSON body whose leader is null; reads
// still work.
func TestHANoEtcdRefusesWithClearStatus(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := dead.Addr().String()
	dead.Close()
	c := startHA(t, []string{"http://" + addr}, nil)
	if code, _ := c.do("GET", "/healthz", nil); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	code, r := c.readyz()
	if code != 503 || r["status"] != "not_ready" || r["role"] != "standby" || r["leader"] != nil {
		t.Fatalf("readyz %d %v", code, r)
	}
	code, hdr, body := c.noFollow("PUT", "/quota/t1", `{"limit_gb": 1}`)
	if code != 503 || hdr.Get("Location") != "" || body["leader"] != nil || !strings.Contains(body["detail"].(string), "no leader") {
		t.Fatalf("PUT without a leader: %d %v %v", code, hdr, body)
	}
	if got := hdr.Get("Retry-After"); got != "1" {
		t.Errorf("503 Retry-After %q, want 1", got)
	}
	if got := c.metric(`lmcache_coordinator_standby_redirects_total{result="no_leader"}`); got != 1 {
		t.Errorf("standby_redirects_total{no_leader} %v, want 1", got)
	}
	if got := c.metric(`lmcache_coordinator_standby_redirects_total{result="redirect"}`); got != 0 {
		t.Errorf("standby_redirects_total{redirect} %v, want 0", got)
	}
	if q := c.must("GET", "/quota/t1", nil, 200); q["quota_exists"] != false {
		t.Fatalf("quota %v", q)
	}
	if _, err := coordinator.New(func() config.Config {
		cfg := testConfig()
		cfg.HA.EtcdEndpoints, cfg.StateFile = "http://"+addr, t.TempDir()+"/s.json"
		return cfg
	}()); err == nil || !strings.Contains(err.Error(), "--state-file") {
		t.Fatalf("HA with --state-file: %v", err)
	}
}

func (m *mpServer) listCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.listQueries)
}

var logTime = regexp.MustCompile(`^time=(\S+) `)

// logTimes returns the time of every log line containing msg.
func logTimes(t *testing.T, logs string, msg string) []time.Time {
	t.Helper()
	var out []time.Time
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("log line without time: %q", line)
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, at)
	}
	return out
}

// TestHAPartitionedLeaderStopsDispatchingFirst: the leader reaches etcd
// through proxies; cutting them partitions it from etcd while it keeps
// running. It stops leading at its renew deadline, before etcd can expire
// its lease and elect the standby: its step-down and every eviction it
// dispatched come before the new leader's term begins, it reports
// not-ready, and it refuses intent writes with 503 (no leader it can
// name). The new leader dispatches under a higher fence.
func TestHAPartitionedLeaderStopsDispatchingFirst(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	proxies, viaProxy := etcdtest.ProxyAll(t, cl)
	mpA, mpB := newMP(t), newMP(t)
	fast := func(c *config.Config) { c.EvictionCheckInterval, c.InflightTTL = 0.1, 0 }
	a := startHA(t, viaProxy, fast)
	waitFor(t, "A ready", func() bool { code, _ := a.readyz(); return code == 200 })
	b := startHA(t, cl.Endpoints, fast)
	waitFor(t, "B sees A lead", func() bool { _, r := b.readyz(); return r["leader"] == a.base })
	a.must("PUT", "/quota/t1", map[string]any{"limit_gb": 0.0009765625}, 200)
	waitFor(t, "B mirrors the quota", func() bool { return b.must("GET", "/quota/t1", nil, 200)["quota_exists"] == true })
	mpA.register(a, "mp-a")
	mpB.register(b, "mp-b")
	a.events(storeEvents("t1", 0, 10, 200000)...)
	b.events(storeEvents("t1", 0, 10, 200000)...)
	waitFor(t, "A dispatches", func() bool { return len(mpA.deleteBatches()) > 0 })

	for _, p := range proxies {
		p.Cut()
	}
	waitFor(t, "B leads", func() bool { code, _ := b.readyz(); return code == 200 })
	waitFor(t, "B dispatches", func() bool { return len(mpB.deleteBatches()) > 0 })
	if len(mpB.deleteBatches()) == 0 || len(mpA.deleteBatches()) == 0 {
		t.Fatal("no dispatches")
	}
	bLeads := logTimes(t, b.logs.String(), "msg=\"leading:")
	aDown := logTimes(t, a.logs.String(), "msg=\"not leading:")
	aSent := logTimes(t, a.logs.String(), "msg=\"eviction dispatched\"")
	if len(bLeads) != 1 || len(aDown) != 1 || len(aSent) == 0 {
		t.Fatalf("log lines: B leading %v, A stepped down %v, A dispatched %d", bLeads, aDown, len(aSent))
	}
	if !aDown[0].Before(bLeads[0]) {
		t.Errorf("A stepped down at %v, not before B led at %v", aDown[0], bLeads[0])
	}
	for _, at := range aSent {
		if !at.Before(bLeads[0]) {
			t.Errorf("A dispatched at %v, during B's term (from %v)", at, bLeads[0])
		}
	}
	t.Logf("A stopped %v before B's term began; A dispatched %d times before", bLeads[0].Sub(aDown[0]).Round(time.Millisecond), len(aSent))
	if code, r := a.readyz(); code != 503 || r["role"] != "standby" {
		t.Errorf("partitioned A readyz %d %v", code, r)
	}
	if code, _, body := a.noFollow("PUT", "/quota/t2", `{"limit_gb": 1}`); code != 503 || body["leader"] != nil {
		t.Errorf("partitioned A PUT: %d %v", code, body)
	}
	if got, revB := b.metric("lmcache_coordinator_eviction_dispatch_fence_revision"), b.metric("lmcache_coordinator_leader_revision"); got != revB || revB <= a.metric("lmcache_coordinator_eviction_dispatch_fence_revision") {
		t.Errorf("fences: B dispatched under %v (its term %v), A under %v", got, revB, a.metric("lmcache_coordinator_eviction_dispatch_fence_revision"))
	}
	if lost := a.metric("lmcache_coordinator_leader_lost_total"); lost != 1 {
		t.Errorf("A lost_total %v", lost)
	}
}
