package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/statefile"
	"github.com/lmcache-go/lmcache/internal/etcdtest"
)

const (
	quotaOverBoundWarn = `level=WARN msg="quota table is over its bound`
	registeredQuotas   = "lmcache_coordinator_registered_quotas"
)

// quotaCount is the number of rows GET /quota lists (no usage is ingested
// in these tests, so each row is an explicit quota), checked against the
// registered_quotas gauge.
func (c *coord) quotaCount() int {
	c.t.Helper()
	n := len(c.must("GET", "/quota", nil, 200)["by_cache_salt"].([]any))
	if g := c.metric(registeredQuotas); g != float64(n) {
		c.t.Fatalf("GET /quota lists %d quotas, registered_quotas says %v", n, g)
	}
	return n
}

// tooMany asserts a 400 too-many-quotas refusal naming bound and held.
func (c *coord) tooMany(salt string, bound, held int) {
	c.t.Helper()
	code, raw := c.do("PUT", "/quota/"+salt, map[string]any{"limit_gb": 1.0})
	want := fmt.Sprintf("too many quotas: at most %d cache_salt limits may be registered and %d are; delete unused ones first", bound, held)
	var body struct{ Detail string }
	if err := json.Unmarshal(raw, &body); code != 400 || err != nil || !strings.HasPrefix(body.Detail, want) {
		c.t.Fatalf("PUT /quota/%s: %d %s, want 400 with detail %q", salt, code, raw, want)
	}
	if q := c.must("GET", "/quota/"+salt, nil, 200); q["quota_exists"] != false {
		c.t.Fatalf("refused quota %s set anyway: %v", salt, q)
	}
}

// stateQuotas reads the quotas the state file on disk holds.
func stateQuotas(t *testing.T, path string) map[string]int64 {
	t.Helper()
	st, err := statefile.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Quotas
}

// TestQuotaBoundRefusesNewSalts: with the bound lowered to 3 and a state
// file, concurrent PUTs of 8 new salts on an empty table set exactly 3;
// the other 5 are answered 400 {"detail": "too many quotas: ..."} and
// counted in quotas_refused_total, and neither memory nor the state file
// holds them. At the bound a held salt's limit can still be replaced, and
// a delete frees an entry for a new salt. The table never went over the
// bound, so no WARN is logged.
func TestQuotaBoundRefusesNewSalts(t *testing.T) {
	t.Cleanup(coordinator.SetMaxQuotas(3))
	path := filepath.Join(t.TempDir(), "state.json")
	c := startCoord(t, func(cfg *config.Config) { cfg.StateFile = path })

	codes := make([]int, 8)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() {
			req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/quota/c%d", c.base, i), strings.NewReader(`{"limit_gb": 1}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := c.client.Do(req); err == nil {
				codes[i] = resp.StatusCode
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	var held []string
	refused := 0
	for i, code := range codes {
		switch code {
		case 200:
			held = append(held, fmt.Sprintf("c%d", i))
		case 400:
			refused++
		default:
			t.Fatalf("PUT /quota/c%d: %d", i, code)
		}
	}
	if len(held) != 3 || refused != 5 {
		t.Fatalf("%d set and %d refused of 8 concurrent new salts at bound 3, want 3 and 5", len(held), refused)
	}
	if n := c.quotaCount(); n != 3 {
		t.Fatalf("table holds %d quotas, want 3", n)
	}
	if got := stateQuotas(t, path); len(got) != 3 {
		t.Fatalf("state file holds %v, want the 3 set", got)
	}
	c.tooMany("new", 3, 3)
	c.tooMany("_default", 3, 3) // the empty salt is an entry like any other
	if got := c.metric("lmcache_coordinator_quotas_refused_total"); got != 7 {
		t.Fatalf("quotas_refused_total %v, want 7", got)
	}

	c.must("PUT", "/quota/"+held[0], map[string]any{"limit_gb": 2.0}, 200)
	if q := c.must("GET", "/quota/"+held[0], nil, 200); q["quota_limit_gb"] != 2.0 {
		t.Fatalf("replacing %s at the bound: %v", held[0], q)
	}
	if r := c.must("DELETE", "/quota/"+held[1], nil, 200); r["status"] != "removed" {
		t.Fatalf("DELETE at the bound: %v", r)
	}
	c.must("PUT", "/quota/new", map[string]any{"limit_gb": 1.0}, 200)
	if n := c.quotaCount(); n != 3 {
		t.Fatalf("table holds %d quotas, want 3", n)
	}
	if got := stateQuotas(t, path); len(got) != 3 || got["new"] != 1<<30 || got[held[0]] != 2<<30 {
		t.Fatalf("state file holds %v", got)
	}
	if got := c.metric("lmcache_coordinator_quotas_refused_total"); got != 7 {
		t.Fatalf("quotas_refused_total %v after the accepted writes, want 7", got)
	}
	if c.logs.Has(quotaOverBoundWarn) {
		t.Fatalf("over-bound WARN for a table that never went over:\n%s", c.logs.String())
	}
}

// TestQuotaBoundStateFileRestoreOverBound: at the real bound
// (quota.MaxQuotas = 100,000), a state file holding 100,002 quotas (an
// older version, or a larger bound, wrote it) is restored whole: startup
// succeeds, all 100,002 are listed, and one WARN names the counts. New
// salts are refused (400) until the table is below the bound, also at
// exactly 100,000; replacing a held salt's limit works throughout.
func TestQuotaBoundStateFileRestoreOverBound(t *testing.T) {
	bound := coordinator.MaxQuotas
	if bound != 100_000 {
		t.Fatalf("MaxQuotas %d, want the MP server's 100,000", bound)
	}
	path := filepath.Join(t.TempDir(), "state.json")
	st := statefile.State{Version: statefile.Version, Quotas: map[string]int64{}}
	for i := range bound + 2 {
		st.Quotas[fmt.Sprintf("s%d", i)] = 1 << 20
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCoord(t, func(cfg *config.Config) { cfg.StateFile = path })

	if n := c.quotaCount(); n != bound+2 {
		t.Fatalf("restored %d quotas of %d", n, bound+2)
	}
	if got := strings.Count(c.logs.String(), quotaOverBoundWarn); got != 1 {
		t.Fatalf("%d over-bound WARN lines, want 1:\n%s", got, c.logs.String())
	}
	if want := "from=state_file quotas=100002 max_quotas=100000"; !c.logs.Has(want) {
		t.Fatalf("WARN lacks %q:\n%s", want, c.logs.String())
	}
	c.tooMany("new", bound, bound+2)
	c.must("PUT", "/quota/s7", map[string]any{"limit_gb": 2.0}, 200)
	for _, s := range []string{"s1", "s2"} {
		if r := c.must("DELETE", "/quota/"+s, nil, 200); r["status"] != "removed" {
			t.Fatalf("DELETE %s: %v", s, r)
		}
	}
	c.tooMany("new", bound, bound)
	c.must("DELETE", "/quota/s3", nil, 200)
	c.must("PUT", "/quota/new", map[string]any{"limit_gb": 1.0}, 200)
	c.tooMany("new2", bound, bound)
	if got := c.metric("lmcache_coordinator_quotas_refused_total"); got != 3 {
		t.Fatalf("quotas_refused_total %v, want 3", got)
	}
	got := stateQuotas(t, path)
	if len(got) != bound || got["new"] != 1<<30 || got["s7"] != 2<<30 {
		t.Fatalf("state file holds %d quotas (new %d, s7 %d), want %d", len(got), got["new"], got["s7"], bound)
	}
	if n := c.metric(registeredQuotas); n != float64(bound) {
		t.Fatalf("table holds %v quotas, want %d", n, bound)
	}
	if got := strings.Count(c.logs.String(), quotaOverBoundWarn); got != 1 {
		t.Fatalf("%d over-bound WARN lines after the writes, want 1", got)
	}
}

// etcdQuotas counts the quota keys the HA tests' intent prefix holds.
func etcdQuotas(t *testing.T, cli *clientv3.Client) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/test/ha/intent/quota/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}

// TestQuotaBoundHA: with the bound lowered to 3, the HA leader A refuses a
// 4th salt (400, counted, nothing committed to etcd) and the standby B
// mirrors exactly the 3. Two more quotas then land in etcd in one
// transaction, as a leader with a larger bound would commit them: A and B
// both apply all 5 from the watch (neither drops one) and WARN once, and C,
// started after, restores all 5 from etcd and WARNs once. After A stops,
// the new leader keeps the 5, refuses a new salt until the table is below
// 3, and replaces held salts' limits throughout.
func TestQuotaBoundHA(t *testing.T) {
	t.Cleanup(coordinator.SetMaxQuotas(3))
	cl := etcdtest.Start(t, 1)
	cli := etcdtest.NewClient(t, cl.Endpoints)
	a := startHA(t, cl.Endpoints, nil)
	waitFor(t, "A ready", func() bool { code, _ := a.readyz(); return code == 200 })
	b := startHA(t, cl.Endpoints, nil)
	waitFor(t, "B sees A lead", func() bool { _, r := b.readyz(); return r["leader"] == a.base })

	for _, s := range []string{"q0", "q1", "q2"} {
		a.must("PUT", "/quota/"+s, map[string]any{"limit_gb": 1.0}, 200)
	}
	a.tooMany("q3", 3, 3)
	if got := a.metric("lmcache_coordinator_quotas_refused_total"); got != 1 {
		t.Fatalf("A quotas_refused_total %v, want 1", got)
	}
	if n := etcdQuotas(t, cli); n != 3 {
		t.Fatalf("etcd holds %d quotas, want 3", n)
	}
	waitFor(t, "B mirrors the 3 quotas", func() bool { return b.metric(registeredQuotas) == 3 })
	if n := b.quotaCount(); n != 3 {
		t.Fatalf("B holds %d quotas, want 3", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut("/test/ha/intent/quota/x0", "1048576"), clientv3.OpPut("/test/ha/intent/quota/x1", "1048576")).Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A and B apply all 5 quotas", func() bool { return a.metric(registeredQuotas) == 5 && b.metric(registeredQuotas) == 5 })
	c := startHA(t, cl.Endpoints, nil)
	waitFor(t, "C restores all 5 quotas", func() bool { return c.metric(registeredQuotas) == 5 })
	for name, co := range map[string]*coord{"A": a, "B": b, "C": c} {
		if n := co.quotaCount(); n != 5 {
			t.Fatalf("%s holds %d quotas, want 5", name, n)
		}
		if got := strings.Count(co.logs.String(), quotaOverBoundWarn); got != 1 || !co.logs.Has("from=etcd quotas=5 max_quotas=3") {
			t.Fatalf("%s: %d over-bound WARN lines, want 1 with from=etcd quotas=5 max_quotas=3:\n%s", name, got, co.logs.String())
		}
	}
	a.tooMany("q3", 3, 5)
	a.must("PUT", "/quota/x0", map[string]any{"limit_gb": 2.0}, 200)

	a.stop()
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}
	var l *coord
	waitFor(t, "B or C leads", func() bool {
		for _, co := range []*coord{b, c} {
			if code, _ := co.readyz(); code == 200 {
				l = co
				return true
			}
		}
		return false
	})
	if n := l.quotaCount(); n != 5 {
		t.Fatalf("new leader holds %d quotas, want 5", n)
	}
	if q := l.must("GET", "/quota/x0", nil, 200); q["quota_limit_gb"] != 2.0 {
		t.Fatalf("new leader's x0: %v", q)
	}
	l.tooMany("q3", 3, 5)
	l.must("PUT", "/quota/q0", map[string]any{"limit_gb": 3.0}, 200)
	l.must("DELETE", "/quota/x0", nil, 200)
	l.must("DELETE", "/quota/x1", nil, 200)
	l.tooMany("q3", 3, 3)
	l.must("DELETE", "/quota/q2", nil, 200)
	l.must("PUT", "/quota/q3", map[string]any{"limit_gb": 1.0}, 200)
	l.tooMany("q4", 3, 3)
	if got := l.metric("lmcache_coordinator_quotas_refused_total"); got != 3 {
		t.Fatalf("new leader quotas_refused_total %v, want 3", got)
	}
	if n := etcdQuotas(t, cli); n != 3 {
		t.Fatalf("etcd holds %d quotas, want 3", n)
	}
}
