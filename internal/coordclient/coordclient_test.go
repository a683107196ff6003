package coordclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/coordclient"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordtest"
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/polltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

var hc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	res, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return res.StatusCode
}

type instance struct {
	InstanceID string `json:"instance_id"`
	IP         string `json:"ip"`
	HTTPPort   int    `json:"http_port"`
}

func instances(t *testing.T, base string) []instance {
	var out struct{ Instances []instance }
	getJSON(t, base+"/instances", &out)
	return out.Instances
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, 10*time.Second, what, cond)
}

func runClient(t *testing.T, c *coordclient.Client) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func TestRegisterHeartbeatReregisterDeregister(t *testing.T) {
	base := coordtest.Start(t, listen(t), nil)
	m := mpmetrics.New("mp-a", nil)
	c, err := coordclient.New(coordclient.Config{URL: base + "/", HTTPPort: 8123, InstanceID: "mp-a", AdvertiseIP: "10.1.2.3",
		HeartbeatInterval: 20 * time.Millisecond, Metrics: m, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	stop := runClient(t, c)
	waitFor(t, "registration", func() bool { return c.Registered() && len(instances(t, base)) == 1 })
	in := instances(t, base)[0]
	if in.InstanceID != "mp-a" || in.IP != "10.1.2.3" || in.HTTPPort != 8123 || !c.Registered() {
		t.Fatalf("registered as %+v", in)
	}
	// The coordinator forgets us: the next heartbeat gets 404 and the client
	// registers again under the same id.
	req, _ := http.NewRequest(http.MethodDelete, base+"/instances/mp-a", nil)
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	waitFor(t, "re-registration", func() bool {
		l := instances(t, base)
		return m.CoordRegistrations.Value() >= 2 && len(l) == 1 && l[0].InstanceID == "mp-a"
	})
	stop()
	if l := instances(t, base); len(l) != 0 {
		t.Fatalf("still registered after shutdown: %+v", l)
	}
}

// downUntilOpened is a listener that, until opened, closes every
// connection it accepts (the client sees no coordinator) and afterwards
// hands them to the server. The address stays bound throughout, so the
// coordinator "comes up" on it without racing anything else for the port.
type downUntilOpened struct {
	net.Listener
	up atomic.Bool
}

func (l *downUntilOpened) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.up.Load() {
			return c, err
		}
		c.Close()
	}
}

func TestRandomInstanceIDAndRetryWhileDown(t *testing.T) {
	// The coordinator's address refuses service until the client has
	// failed three times, then the coordinator comes up on it.
	ln := &downUntilOpened{Listener: listen(t)}
	addr := ln.Addr().String()
	base := coordtest.Start(t, ln, nil)
	reg := periodic.NewRegistry()
	c, err := coordclient.New(coordclient.Config{URL: "http://" + addr, HTTPPort: 8080, HeartbeatInterval: 20 * time.Millisecond, Periodic: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	id := c.InstanceID()
	if len(id) != 36 || id[14] != '4' {
		t.Fatalf("instance id %q is not a UUID4", id)
	}
	runClient(t, c)
	waitFor(t, "three failed registration attempts", func() bool {
		st, ok := reg.Get(coordclient.LoopRegistrar)
		return ok && st.FailedRuns >= 3
	})
	if c.Registered() {
		t.Fatal("registered with no coordinator")
	}
	ln.up.Store(true)
	waitFor(t, "registration after the coordinator came up", func() bool {
		l := instances(t, base)
		return len(l) == 1 && l[0].InstanceID == id
	})
}

func TestDisabledClientIsInert(t *testing.T) {
	c, err := coordclient.New(coordclient.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Enabled() {
		t.Fatal("enabled without a URL")
	}
	if err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.OnStored([]objkey.Key{{ChunkHash: "a", ModelName: "m"}}, []int64{1})
	if c.Pending() != 0 {
		t.Fatal("queued events without a coordinator")
	}
	for _, bad := range []coordclient.Config{{URL: "ftp://x", HTTPPort: 1}, {URL: "http://x:1", HTTPPort: 0}} {
		if _, err := coordclient.New(bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}
}

// TestL2EventsReachCoordinator wires the client as an L2 listener on a real
// engine with an fs adapter: write-behind store events and DELETE events
// move the coordinator's usage.
func TestL2EventsReachCoordinator(t *testing.T) {
	base := coordtest.Start(t, listen(t), nil)
	m := mpmetrics.New("mp-e", nil)
	c, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8080, InstanceID: "mp-e", HeartbeatInterval: 50 * time.Millisecond,
		EventReporting: true, EventFlushInterval: 20 * time.Millisecond, Metrics: m, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	a, err := fs.New(fs.Config{BasePath: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	eng, err := engine.New(engine.Config{L1SizeBytes: 8 << 20, L2: []engine.AdapterConfig{{}}}, []l2.Adapter{a}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	eng.AddL2Listener(c)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = eng.Run(ctx) }()
	defer func() {
		// engine.Run hangs if cancelled with uploads queued; drain first.
		waitFor(t, "write-behind to drain", func() bool {
			for _, a := range eng.Counters().L2 {
				if a.PendingStores > 0 || a.InflightStores > 0 {
					return false
				}
			}
			return true
		})
		cancel()
		wg.Wait()
		// Every read lease, upload pin and staged write the test took must
		// be gone once Run returned; name the keys that are not.
		if err := eng.CloseChecked(); err != nil {
			t.Error(err)
		}
	}()
	runClient(t, c)

	keys := make([]objkey.Key, 4)
	data := make([][]byte, 4)
	for i := range keys {
		k, err := objkey.New([]byte{byte(i), 1, 2, 3}, "org/model", objkey.RankFor(1, 0), 0, "tenant")
		if err != nil {
			t.Fatal(err)
		}
		keys[i], data[i] = k, make([]byte, 4096)
	}
	if n, err := eng.Put(keys, data); err != nil || n != 4 {
		t.Fatalf("Put = %d, %v", n, err)
	}
	usage := func() float64 {
		var out struct {
			TotalGB float64 `json:"total_gb"`
		}
		getJSON(t, base+"/quota?tier=l2", &out)
		return out.TotalGB * (1 << 30)
	}
	waitFor(t, "store events", func() bool { return math.Abs(usage()-4*4096) < 0.5 })
	removed, err := eng.DeleteL2(context.Background(), 0, keys[:3])
	if err != nil || len(removed) != 3 {
		t.Fatalf("DeleteL2 = %v, %v", removed, err)
	}
	waitFor(t, "delete events", func() bool { return math.Abs(usage()-4096) < 0.5 })
	// The coordinator applies a batch before the client counts it as sent.
	waitFor(t, "batch accounting", func() bool { return c.SentBatches() >= 2 && m.CoordBatchesSent.Value() >= 2 })
	if c.Dropped() != 0 {
		t.Fatalf("sent %d batches, dropped %d", c.SentBatches(), c.Dropped())
	}
}

// recorder is a coordinator stand-in that records /quota/events batches and
// can fail on demand (fault injection).
type recorder struct {
	mu      sync.Mutex
	batches []coordclient.Batch
	fail    int // answer 500 to this many batches first
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/quota/events" {
		http.NotFound(w, req)
		return
	}
	var b coordclient.Batch
	if err := json.NewDecoder(req.Body).Decode(&b); err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, b)
	if r.fail > 0 {
		r.fail--
		http.Error(w, "boom", http.StatusInternalServerError)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]int{"recorded": len(b.Events)})
}

func TestBatchesSeqRetryAndBoundedQueue(t *testing.T) {
	rec := &recorder{fail: 1}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, InstanceID: "mp-q", EventReporting: true, QueueSize: 5, MaxBatch: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c.OnStored([]objkey.Key{chunkKey(1), chunkKey(2)}, []int64{10, 20})
	c.OnAccessed([]objkey.Key{chunkKey(1)})
	c.OnDeleted([]objkey.Key{chunkKey(2), chunkKey(3), chunkKey(4)}) // only 2 fit: 1 dropped
	if c.Pending() != 5 || c.Dropped() != 1 {
		t.Fatalf("pending %d dropped %d", c.Pending(), c.Dropped())
	}
	if err := c.Flush(context.Background()); err == nil {
		t.Fatal("first flush should fail (injected 500)")
	}
	if c.Pending() != 5 {
		t.Fatalf("failed batch not kept for retry: pending %d", c.Pending())
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.batches) != 4 {
		t.Fatalf("%d batches, want 4 (1 failed + 3 of at most 2 events)", len(rec.batches))
	}
	var types []string
	for i, b := range rec.batches {
		if b.Seq != int64(i+1) || b.InstanceID != "mp-q" || b.Tier != "l2" || len(b.Events) > 2 {
			t.Fatalf("batch %d = %+v", i, b)
		}
		if i > 0 {
			for _, e := range b.Events {
				types = append(types, e.Type)
			}
		}
	}
	want := []string{"store", "store", "lookup", "delete", "delete"}
	if len(types) != len(want) {
		t.Fatalf("event types %v", types)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("event types %v, want %v", types, want)
		}
	}
	first := rec.batches[1].Events[0]
	if first.Bytes != 10 || first.Key.ChunkHashHex != "01" || first.Key.ModelName != "m" {
		t.Fatalf("first event = %+v", first)
	}
}

func TestLoopsInPeriodicRegistry(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/quota/events" {
			rec.ServeHTTP(w, r)
			return
		}
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	reg := periodic.NewRegistry()
	c, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, EventReporting: true, Periodic: reg,
		HeartbeatInterval: 10 * time.Millisecond, EventFlushInterval: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	stop := runClient(t, c)
	waitFor(t, "failed registrations recorded", func() bool {
		st, ok := reg.Get(coordclient.LoopRegistrar)
		return ok && st.IsRunning && st.FailedRuns >= 2 && st.Level == periodic.High
	})
	waitFor(t, "reporter runs", func() bool {
		st, ok := reg.Get(coordclient.LoopReporter)
		return ok && st.TotalRuns >= 2 && st.FailedRuns == 0
	})
	stop()
	if st, _ := reg.Get(coordclient.LoopRegistrar); st.IsRunning || c.Registered() {
		t.Fatalf("after stop: %+v registered=%v", st, c.Registered())
	}
}

// TestAuthTokenSentToCoordinator: against a coordinator with --auth-token,
// a client with the same AuthToken registers, heartbeats, reports events
// and deregisters; one with a wrong token is refused (401 →
// ErrUnauthorized, counted as failed registrar runs) and never registered.
func TestAuthTokenSentToCoordinator(t *testing.T) {
	const tok = "fleet-s3cret"
	base := coordtest.Start(t, listen(t), func(c *config.Config) { c.AuthToken = tok })
	reg := periodic.NewRegistry()
	good, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8080, InstanceID: "mp-good", AuthToken: tok, HeartbeatInterval: 20 * time.Millisecond,
		EventReporting: true, EventFlushInterval: time.Hour, Periodic: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	badReg := periodic.NewRegistry()
	bad, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8081, InstanceID: "mp-bad", AuthToken: "wrong", HeartbeatInterval: 20 * time.Millisecond,
		EventReporting: true, EventFlushInterval: time.Hour, Periodic: badReg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	stopGood := runClient(t, good)
	runClient(t, bad)
	waitFor(t, "registration and two heartbeats", func() bool {
		st, _ := reg.Get(coordclient.LoopRegistrar)
		return good.Registered() && st.TotalRuns >= 3 && st.FailedRuns == 0
	})
	good.OnStored([]objkey.Key{{ChunkHash: "0a", ModelName: "m", KVRank: 0}}, []int64{1 << 20})
	if err := good.Flush(context.Background()); err != nil {
		t.Fatalf("flush with the right token: %v", err)
	}
	var q struct {
		UsageGB float64 `json:"usage_gb"`
	}
	getJSON(t, base+"/quota/_default", &q)
	if q.UsageGB != 1.0/1024 {
		t.Fatalf("usage %v GB after a 1 MiB store event", q.UsageGB)
	}
	waitFor(t, "the wrong token to be refused three times", func() bool {
		st, _ := badReg.Get(coordclient.LoopRegistrar)
		return st.FailedRuns >= 3
	})
	st, _ := badReg.Get(coordclient.LoopRegistrar)
	if msg, _ := st.LastSummary["message"].(string); bad.Registered() || !strings.Contains(msg, "401") {
		t.Fatalf("wrong-token client: registered=%v last=%q", bad.Registered(), msg)
	}
	if l := instances(t, base); len(l) != 1 || l[0].InstanceID != "mp-good" {
		t.Fatalf("instances %+v", l)
	}
	// Its events are refused too, and stay queued for a retry.
	bad.OnStored([]objkey.Key{{ChunkHash: "0b", ModelName: "m", KVRank: 0}}, []int64{1 << 20})
	if err := bad.Flush(context.Background()); !errors.Is(err, coordclient.ErrUnauthorized) || bad.Pending() != 1 {
		t.Fatalf("wrong-token flush: %v, pending %d", err, bad.Pending())
	}
	getJSON(t, base+"/quota/_default", &q)
	if q.UsageGB != 1.0/1024 {
		t.Fatalf("a refused batch changed usage: %v GB", q.UsageGB)
	}
	stopGood()
	if l := instances(t, base); len(l) != 0 {
		t.Fatalf("deregistration with the token failed: %+v", l)
	}
}

// TestURLPasswordNeverLogged: a coordinator URL with userinfo is logged
// with the password masked, on success and on failure.
func TestURLPasswordNeverLogged(t *testing.T) {
	ln := listen(t)
	base := coordtest.Start(t, ln, nil)
	var logs logtest.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	withPass := strings.Replace(base, "http://", "http://ops:pw-s3cret@", 1)
	c, err := coordclient.New(coordclient.Config{URL: withPass, HTTPPort: 8080, InstanceID: "mp-u", HeartbeatInterval: 20 * time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	waitFor(t, "registration", c.Registered)
	dead := listen(t)
	deadAddr := dead.Addr().String()
	dead.Close()
	reg := periodic.NewRegistry()
	d, err := coordclient.New(coordclient.Config{URL: "http://ops:pw-s3cret@" + deadAddr, HTTPPort: 8080, HeartbeatInterval: 20 * time.Millisecond, Periodic: reg, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, d)
	waitFor(t, "a failed attempt", func() bool { st, _ := reg.Get(coordclient.LoopRegistrar); return st.FailedRuns >= 1 })
	out := logs.String()
	if !strings.Contains(out, "registered with coordinator") || !strings.Contains(out, "coordinator unreachable") {
		t.Fatalf("expected both log lines:\n%s", out)
	}
	if strings.Contains(out, "pw-s3cret") || !strings.Contains(out, "ops:xxxxx@") {
		t.Fatalf("password not masked:\n%s", out)
	}
}

// TestUndeliveredAtShutdownCountedDropped: events the final flush cannot
// deliver (the coordinator answers 500 to every batch) are counted as
// dropped when Run ends, in Dropped and the metric, and so is an event
// enqueued after Run returned, which no flush would ever send.
func TestUndeliveredAtShutdownCountedDropped(t *testing.T) {
	rec := &recorder{fail: 1 << 30}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	m := mpmetrics.New("mp-x", nil)
	c, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, InstanceID: "mp-x", EventReporting: true,
		EventEndpoint: coordclient.EndpointQuotaEvents, HeartbeatInterval: time.Hour, EventFlushInterval: time.Hour,
		Metrics: m, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c.OnStored([]objkey.Key{chunkKey(1), chunkKey(2)}, []int64{10, 20})
	c.OnDeleted([]objkey.Key{chunkKey(3)})
	stop := runClient(t, c)
	stop()
	if c.Pending() != 0 || c.Dropped() != 3 || m.CoordEventsDropped.Value() != 3 {
		t.Fatalf("after Run: pending %d, dropped %d, metric %v; want 0, 3, 3", c.Pending(), c.Dropped(), m.CoordEventsDropped.Value())
	}
	rec.mu.Lock()
	attempts := len(rec.batches)
	rec.mu.Unlock()
	if attempts == 0 {
		t.Fatal("the final flush never tried to deliver")
	}
	c.OnAccessed([]objkey.Key{chunkKey(4)})
	if c.Pending() != 0 || c.Dropped() != 4 || m.CoordEventsDropped.Value() != 4 {
		t.Fatalf("after a late event: pending %d, dropped %d, metric %v; want 0, 4, 4", c.Pending(), c.Dropped(), m.CoordEventsDropped.Value())
	}
}

// chunkKey is model m's key of the one-byte chunk hash i.
func chunkKey(i int) objkey.Key {
	key, _ := objkey.New([]byte{byte(i)}, "m", 0, 0, "")
	return key
}
