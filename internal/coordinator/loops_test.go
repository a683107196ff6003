package coordinator_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

type threadStatus struct {
	Name      string  `json:"name"`
	Level     string  `json:"level"`
	Interval  float64 `json:"interval"`
	IsRunning bool    `json:"is_running"`
	IsActive  bool    `json:"is_active"`
	TotalRuns int64   `json:"total_runs"`

	LastSummary struct {
		Message string            `json:"message"`
		Extra   map[string]string `json:"extra_info"`
	} `json:"last_summary"`
}

func (c *coord) threads() map[string]threadStatus {
	c.t.Helper()
	code, raw := c.do("GET", "/periodic-threads", nil)
	if code != 200 {
		c.t.Fatalf("periodic-threads %d %s", code, raw)
	}
	var body struct {
		Threads []threadStatus `json:"threads"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		c.t.Fatal(err)
	}
	out := map[string]threadStatus{}
	for _, th := range body.Threads {
		out[th.Name] = th
	}
	return out
}

// TestCoordinatorLoopsRegistered: the health sweep, eviction loop, startup
// resync and ledger reserve are periodic loops with their level and
// interval; they run, and the one-shot resync stops running once it has
// finished.
func TestCoordinatorLoopsRegistered(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) {
		cfg.HealthCheckInterval = 0.02
		cfg.EvictionCheckInterval = 0.03
		cfg.EnableStartupResync = true
		cfg.ResyncMaxWait = 0
		cfg.ResyncPollInterval = 0.01
	})
	waitFor(t, "every loop to run", func() bool {
		th := c.threads()
		return th[coordinator.LoopHealthSweep].TotalRuns > 0 && th[coordinator.LoopEviction].TotalRuns > 0 &&
			th[coordinator.LoopResync].TotalRuns > 0 && !th[coordinator.LoopResync].IsRunning &&
			th[coordinator.LoopLedgerReserve].TotalRuns > 0
	})
	th := c.threads()
	if len(th) != 4 {
		t.Fatalf("threads %v", th)
	}
	for name, want := range map[string]threadStatus{
		coordinator.LoopHealthSweep:   {Level: "high", Interval: 0.02, IsRunning: true},
		coordinator.LoopEviction:      {Level: "high", Interval: 0.03, IsRunning: true},
		coordinator.LoopResync:        {Level: "medium", Interval: 0.01, IsRunning: false},
		coordinator.LoopLedgerReserve: {Level: "low", Interval: 5, IsRunning: true},
	} {
		got := th[name]
		if got.Level != want.Level || got.Interval != want.Interval || got.IsRunning != want.IsRunning {
			t.Errorf("%s = %+v, want level %s interval %v running %v", name, got, want.Level, want.Interval, want.IsRunning)
		}
	}
	if code, raw := c.do("GET", "/periodic-threads/"+coordinator.LoopEviction, nil); code != 200 || !strings.Contains(string(raw), `"name":"coordinator-eviction"`) {
		t.Fatalf("one thread: %d %s", code, raw)
	}
	if code, raw := c.do("GET", "/periodic-threads/nope", nil); code != 404 || string(raw) != `{"error":"Thread not found: nope"}` {
		t.Fatalf("unknown thread: %d %s", code, raw)
	}
	if code, raw := c.do("GET", "/periodic-threads?level=bogus", nil); code != 400 || !strings.Contains(string(raw), "Invalid level: bogus") {
		t.Fatalf("bad level: %d %s", code, raw)
	}
	code, raw := c.do("GET", "/periodic-threads?level=medium", nil)
	var body struct {
		Threads []threadStatus `json:"threads"`
	}
	if code != 200 || json.Unmarshal(raw, &body) != nil || len(body.Threads) != 1 || body.Threads[0].Name != coordinator.LoopResync {
		t.Fatalf("level filter: %d %s", code, raw)
	}
}

// TestWedgedLoopShowsInPeriodicHealth: an eviction cycle that never
// returns makes /periodic-threads-health report the eviction loop (and only
// it) unhealthy; once released, health recovers.
func TestWedgedLoopShowsInPeriodicHealth(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) {
		cfg.HealthCheckInterval = 0.02
		cfg.EvictionCheckInterval = 0.02
	})
	type health struct {
		Healthy   bool `json:"healthy"`
		Unhealthy []struct {
			Name string `json:"name"`
		} `json:"unhealthy_threads"`
	}
	get := func() health {
		var h health
		code, raw := c.do("GET", "/periodic-threads-health", nil)
		if code != 200 || json.Unmarshal(raw, &h) != nil {
			t.Fatalf("health %d %s", code, raw)
		}
		return h
	}
	waitFor(t, "healthy loops", func() bool {
		return get().Healthy && c.threads()[coordinator.LoopEviction].TotalRuns > 0
	})
	release := c.srv.HoldEvictionCycles()
	var once sync.Once
	rel := func() { once.Do(release) }
	t.Cleanup(rel) // runs before the coordinator's stop (cleanups are LIFO)
	waitFor(t, "the wedged eviction loop to be reported", func() bool {
		h := get()
		return !h.Healthy && len(h.Unhealthy) == 1 && h.Unhealthy[0].Name == coordinator.LoopEviction
	})
	// The sweep keeps ticking meanwhile (polled: on a loaded machine it may
	// itself be late for a moment).
	sweepRuns := c.threads()[coordinator.LoopHealthSweep].TotalRuns
	waitFor(t, "the health sweep to keep running", func() bool { return c.threads()[coordinator.LoopHealthSweep].TotalRuns > sweepRuns })
	rel()
	waitFor(t, "health to recover", func() bool { return get().Healthy })
}

// TestInFlightRequestDrainsOnStop: a request in flight when the
// coordinator is told to stop completes with its 200 (its context is not
// cancelled), while new connections are refused.
func TestInFlightRequestDrainsOnStop(t *testing.T) {
	mp := newMP(t)
	entered := make(chan struct{})
	unblock := make(chan struct{})
	inner := mp.Config.Handler
	mp.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			close(entered)
			select {
			case <-unblock:
			case <-time.After(30 * time.Second):
			}
		}
		inner.ServeHTTP(w, r)
	})
	// A generous drain deadline: this test is about the request not being
	// cancelled, not about how fast a loaded machine answers it.
	srv, err := coordinator.New(testConfig(), coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), coordinator.WithDrainTimeout(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := runOn(t, srv)
	mp.register(c, "mp-1")
	type result struct {
		code int
		body string
	}
	res := make(chan result, 1)
	go func() {
		resp, err := c.client.Post(c.base+"/cache/prefetches", "application/json", strings.NewReader(`{"instance_id":"mp-1","model_name":"m","world_size":1,"token_ids":[1,2,3,4]}`))
		if err != nil {
			res <- result{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		res <- result{resp.StatusCode, string(b)}
	}()
	<-entered
	c.stop()
	// Shutdown closes the listener first: once a fresh dial fails the drain
	// has begun, and the request is still in flight.
	waitFor(t, "the listener to close", func() bool {
		cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := cl.Get(c.base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err != nil
	})
	close(unblock)
	r := <-res
	if r.code != 200 || r.body != `{"instance_id":"mp-1","request_id":"abc","chunks":2,"status":"submitted"}` {
		t.Fatalf("in-flight request: %d %s", r.code, r.body)
	}
	if err := c.wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestSeqTrackerResetCounted: when the seq tracker hits its bound it is
// cleared, and the reset is counted.
func TestSeqTrackerResetCounted(t *testing.T) {
	defer coordinator.SetMaxSeqTracked(2)()
	c := startCoord(t, nil)
	for _, id := range []string{"a", "b", "c"} {
		c.must("POST", "/quota/events", map[string]any{"instance_id": id, "seq": 1, "events": []any{}}, 200)
	}
	if _, raw := c.do("GET", "/metrics", nil); !strings.Contains(string(raw), "lmcache_coordinator_event_seq_tracker_resets_total 1\n") {
		t.Fatal("reset not counted")
	}
}

// TestSeqTrackerProductionBound: with the bound the server is built with
// (no test override), a door's cursor map holds exactly 100,000 instance
// ids. One POST /events carries 100,000 first batches of distinct
// emitters: no reset, and a replay of the first is still a duplicate (its
// cursor is held). The 100,001st emitter clears the map: the reset is
// counted once and logged once at warn with the limit, and the first
// emitter's replay is then admitted as a first batch.
func TestSeqTrackerProductionBound(t *testing.T) {
	const bound = 100_000
	c, recs := startCoordRecorded(t, nil)
	batch := func(b *strings.Builder, id string) {
		fmt.Fprintf(b, `{"instance_id":%q,"incarnation":1,"seq":1,"event_type":"store","tier":"l2","backend":"fs","entries":[]}`, id)
	}
	post := func(ids ...string) map[string]any {
		var b strings.Builder
		b.WriteString(`{"batches":[`)
		for i, id := range ids {
			if i > 0 {
				b.WriteByte(',')
			}
			batch(&b, id)
		}
		b.WriteString(`]}`)
		return c.must("POST", "/events", b.String(), 200)
	}
	ids := make([]string, bound)
	for i := range ids {
		ids[i] = fmt.Sprintf("emitter-%06d", i)
	}
	wantReply(t, post(ids...), bound, 0, 0)
	metric(t, c, "lmcache_coordinator_event_seq_tracker_resets_total 0")
	wantReply(t, post(ids[0]), 0, 1, 0)
	const msg = "usage-event seq tracker reset: too many distinct instance ids"
	if got := recs.withMsg(msg); len(got) != 0 {
		t.Fatalf("reset logged at %d ids: %+v", bound, got)
	}

	wantReply(t, post("emitter-one-more"), 1, 0, 0)
	metric(t, c, "lmcache_coordinator_event_seq_tracker_resets_total 1")
	want := logRecord{Level: slog.LevelWarn, Msg: msg, Attrs: map[string]string{"component": "coordinator", "limit": "100000"}}
	if got := recs.withMsg(msg); len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Fatalf("reset records %+v, want exactly %+v", got, want)
	}
	wantReply(t, post(ids[0]), 1, 0, 0)
}

// TestLedgerReserveLoop: the reserve loop prepares the ledger's entry pages
// while real ingest goes on. It readies a spare before the first batch;
// the batches that fill the first page (65,536 entries) and start the
// second take spares, and the loop leaves a new one ready: three pages
// prepared or allocated, at least two of them by the loop.
func TestLedgerReserveLoop(t *testing.T) {
	c := startCoord(t, nil)
	waitFor(t, "the reserve loop's first cycle", func() bool { return c.srv.LedgerReserve().SparePage })
	fillFirstEntryPage(c)
	waitFor(t, "a spare after the second page", func() bool {
		r := c.srv.LedgerReserve()
		return r.SparePage && r.PreparedPages+r.ColdPages == 3 && r.PreparedPages >= 2
	})
	waitFor(t, "the loop's summary to count them", func() bool {
		r, sum := c.srv.LedgerReserve(), c.threads()[coordinator.LoopLedgerReserve].LastSummary
		return strings.HasPrefix(sum.Message, "prepared entry_pages=") && sum.Extra["prepared_entry_pages"] == fmt.Sprint(r.PreparedPages) &&
			sum.Extra["ingest_path_entry_pages"] == fmt.Sprint(r.ColdPages) && sum.Extra["ingest_path_index_tables"] == fmt.Sprint(r.ColdTables)
	})
}

// TestLedgerReserveYieldsToRequests: with a POST /quota/events in flight
// (its body still arriving) the reserve loop holds back. Other requests
// fill the first entry page and take the spare; the loop's chunks for the
// next one wait for the stalled request and each goes ahead only after
// the longest wait, counted as capped. The stalled request then completes
// with 200, and the loop's summary shows the counts.
func TestLedgerReserveYieldsToRequests(t *testing.T) {
	c := startCoord(t, nil)
	waitFor(t, "the reserve loop's first cycle", func() bool { return c.srv.LedgerReserve().SparePage })
	body := `{"instance_id":"stalled","seq":1,"events":[{"type":"store","bytes":7,"key":{"chunk_hash_hex":"ff","model_name":"m","kv_rank":0,"cache_salt":"s"}}]}`
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(t.Context(), "POST", c.base+"/quota/events", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	status := make(chan int, 1)
	go func() {
		resp, err := c.client.Do(req)
		if err != nil {
			status <- -1
			return
		}
		_ = resp.Body.Close()
		status <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte(body[:30])); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stalled request's handler", func() bool { return c.srv.LedgerIngesting() == 1 })
	fillFirstEntryPage(c)
	waitFor(t, "a reserve chunk held back until the longest wait", func() bool { return c.srv.LedgerReserve().YieldCapped > 0 })
	if _, err := pw.Write([]byte(body[30:])); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	if code := <-status; code != 200 {
		t.Fatalf("the stalled request: %d", code)
	}
	if n := c.srv.LedgerIngesting(); n != 0 {
		t.Fatalf("%d ingest requests still counted in flight", n)
	}
	waitFor(t, "the loop's summary to count the waits", func() bool {
		r, sum := c.srv.LedgerReserve(), c.threads()[coordinator.LoopLedgerReserve].LastSummary
		return r.YieldWaits >= r.YieldCapped && sum.Extra["yield_waits"] == fmt.Sprint(r.YieldWaits) && sum.Extra["yield_capped"] == fmt.Sprint(r.YieldCapped)
	})
	if g := c.must("GET", "/quota/s", nil, 200); g["usage_gb"] != quota.GB(66_007) {
		t.Errorf("usage after all requests: %v, want %v GB (66,000 + 7 bytes)", g["usage_gb"], quota.GB(66_007))
	}
}

// fillFirstEntryPage stores 66,000 one-byte keys of salt "s" in 1,000-event
// batches from instance "i1": the ledger's first entry page (65,536
// entries) fills and the second begins, taking the reserve's spare.
func fillFirstEntryPage(c *coord) {
	const batch = 1000
	for b := 0; b < 66; b++ {
		evs := make([]any, batch)
		for i := range evs {
			evs[i] = map[string]any{"type": "store", "bytes": 1, "key": map[string]any{
				"chunk_hash_hex": fmt.Sprintf("%08x", b*batch+i), "model_name": "m", "kv_rank": 0, "cache_salt": "s"}}
		}
		c.must("POST", "/quota/events", map[string]any{"instance_id": "i1", "seq": b + 1, "events": evs}, 200)
	}
}
