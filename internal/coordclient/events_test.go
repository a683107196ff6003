package coordclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordclient"
	"github.com/lmcache-go/lmcache/internal/coordtest"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// doors is a coordinator stand-in (fault injection) that records the
// bodies posted to each event door; a door not in serve answers 404.
type doors struct {
	mu     sync.Mutex
	serve  map[string]bool
	fail   int // answer 500 to this many served requests first
	bodies map[string][]string
}

func newDoors(served ...string) *doors {
	d := &doors{serve: map[string]bool{}, bodies: map[string][]string{}}
	for _, p := range served {
		d.serve[p] = true
	}
	return d
}

func (d *doors) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.bodies[r.URL.Path] = append(d.bodies[r.URL.Path], string(raw))
	if !d.serve[r.URL.Path] {
		http.NotFound(w, r)
		return
	}
	if d.fail > 0 {
		d.fail--
		http.Error(w, "boom", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/events" {
		var req kafkaevents.Envelope
		_ = json.Unmarshal(raw, &req)
		_ = json.NewEncoder(w).Encode(map[string]int{"applied": len(req.Batches), "duplicates": 0, "stale": 0})
		return
	}
	var b coordclient.Batch
	_ = json.Unmarshal(raw, &b)
	_ = json.NewEncoder(w).Encode(map[string]int{"recorded": len(b.Events)})
}

func (d *doors) posts(path string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.bodies[path]...)
}

func key(t *testing.T, b byte) objkey.Key {
	t.Helper()
	k, err := objkey.New([]byte{b, 0xee}, "org/m", objkey.RankFor(1, 0), 0, "ten")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestEventsBatchShapeAndRetrySameSeq: /events batches are shaped as
// upstream's CacheEventBatch (one per run of type and backend, access with
// an empty backend, empty token_ids, token_offset -1, the incarnation on
// every batch, seq +1 per batch), and a failed request is resent with the
// same seqs.
func TestEventsBatchShapeAndRetrySameSeq(t *testing.T) {
	d := newDoors("/events")
	d.fail = 1
	srv := httptest.NewServer(d)
	defer srv.Close()
	c, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, InstanceID: "mp-s", EventReporting: true, EventEndpoint: coordclient.EndpointEvents, Incarnation: 4242, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s3 := c.Listener("s3", true)
	fsl := c.Listener("fs", false)
	s3.OnStored([]objkey.Key{key(t, 1), key(t, 2)}, []int64{100, 200})
	fsl.OnStored([]objkey.Key{key(t, 3)}, []int64{300})
	s3.OnAccessed([]objkey.Key{key(t, 1)})
	s3.OnDeleted([]objkey.Key{key(t, 2)})
	if err := c.Flush(context.Background()); err == nil {
		t.Fatal("first flush should fail (injected 500)")
	}
	if c.Pending() != 5 {
		t.Fatalf("pending %d, want the 5 events of the failed request", c.Pending())
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	posts := d.posts("/events")
	if len(posts) != 2 || posts[0] != posts[1] {
		t.Fatalf("want the failed request resent byte for byte, got %d posts:\n%s", len(posts), strings.Join(posts, "\n"))
	}
	var req struct {
		Batches []map[string]any `json:"batches"`
	}
	if err := json.Unmarshal([]byte(posts[1]), &req); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		typ, backend string
		shared       bool
		n            int
	}{{"store", "s3", true, 2}, {"store", "fs", false, 1}, {"access", "", true, 1}, {"delete", "s3", true, 1}}
	if len(req.Batches) != len(want) {
		t.Fatalf("%d batches, want %d: %s", len(req.Batches), len(want), posts[1])
	}
	for i, b := range req.Batches {
		w := want[i]
		if b["instance_id"] != "mp-s" || b["incarnation"] != 4242.0 || b["seq"] != float64(i+1) || b["event_type"] != w.typ ||
			b["tier"] != "l2" || b["backend"] != w.backend || b["shared"] != w.shared || len(b["entries"].([]any)) != w.n ||
			b["capacity_bytes"] != 0.0 || b["capacity_revision"] != 0.0 || b["ts"].(float64) <= 0 {
			t.Fatalf("batch %d = %v, want %+v", i, b, w)
		}
	}
	e := req.Batches[0]["entries"].([]any)[1].(map[string]any)
	k := e["key"].(map[string]any)
	if e["size_bytes"] != 200.0 || e["token_offset"] != -1.0 || len(e["token_ids"].([]any)) != 0 || k["chunk_hash_hex"] != "02ee" || k["model_name"] != "org/m" || k["cache_salt"] != "ten" {
		t.Fatalf("entry = %v", e)
	}
	if len(d.posts("/quota/events")) != 0 {
		t.Fatal("endpoint events posted to /quota/events")
	}
}

// TestAutoFallsBackToQuotaEvents: against a coordinator without /events,
// auto posts the same events to /quota/events at once and remembers it.
func TestAutoFallsBackToQuotaEvents(t *testing.T) {
	d := newDoors("/quota/events")
	srv := httptest.NewServer(d)
	defer srv.Close()
	c, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, InstanceID: "mp-o", EventReporting: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if c.EventEndpoint() != coordclient.EndpointEvents {
		t.Fatalf("auto starts at %s", c.EventEndpoint())
	}
	for i := range 3 {
		c.OnStored([]objkey.Key{key(t, byte(i))}, []int64{64})
		if err := c.Flush(context.Background()); err != nil {
			t.Fatalf("flush %d: %v", i, err)
		}
	}
	if n := len(d.posts("/events")); n != 1 {
		t.Fatalf("%d /events posts, want 1 (the choice is remembered)", n)
	}
	quota := d.posts("/quota/events")
	if len(quota) != 3 || c.EventEndpoint() != coordclient.EndpointQuotaEvents || c.Pending() != 0 {
		t.Fatalf("quota posts %d endpoint %s pending %d", len(quota), c.EventEndpoint(), c.Pending())
	}
	var b coordclient.Batch
	if err := json.Unmarshal([]byte(quota[0]), &b); err != nil || b.Seq != 1 || len(b.Events) != 1 || b.Events[0].Bytes != 64 || b.Events[0].Type != "store" {
		t.Fatalf("first quota batch %s (%v)", quota[0], err)
	}
}

// TestExplicitEndpoints: "events" never falls back (a 404 is an error and
// the events wait); "quota-events" never posts to /events; other values
// are refused.
func TestExplicitEndpoints(t *testing.T) {
	d := newDoors("/quota/events")
	srv := httptest.NewServer(d)
	defer srv.Close()
	ev, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, EventReporting: true, EventEndpoint: coordclient.EndpointEvents, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ev.OnStored([]objkey.Key{key(t, 1)}, []int64{1})
	if err := ev.Flush(context.Background()); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("events-only against a spec-era coordinator: %v", err)
	}
	if ev.Pending() != 1 || len(d.posts("/quota/events")) != 0 {
		t.Fatalf("pending %d, quota posts %d", ev.Pending(), len(d.posts("/quota/events")))
	}
	q, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, EventReporting: true, EventEndpoint: coordclient.EndpointQuotaEvents, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	q.OnDeleted([]objkey.Key{key(t, 1)})
	if err := q.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(d.posts("/events")) != 1 || len(d.posts("/quota/events")) != 1 {
		t.Fatalf("events posts %d (only the events-only client's), quota posts %d", len(d.posts("/events")), len(d.posts("/quota/events")))
	}
	if _, err := coordclient.New(coordclient.Config{URL: srv.URL, HTTPPort: 8080, EventEndpoint: "kafka"}); err == nil || !strings.Contains(err.Error(), "auto, events or quota-events") {
		t.Fatalf("bad endpoint: %v", err)
	}
}

// TestIncarnationPerStart: each client (each server start) gets a larger
// incarnation unless one is configured.
func TestIncarnationPerStart(t *testing.T) {
	a, err := coordclient.New(coordclient.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := coordclient.New(coordclient.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Incarnation() <= 0 || b.Incarnation() <= a.Incarnation() {
		t.Fatalf("incarnations %d then %d", a.Incarnation(), b.Incarnation())
	}
	c, _ := coordclient.New(coordclient.Config{Incarnation: 9})
	if c.Incarnation() != 9 {
		t.Fatalf("configured incarnation = %d", c.Incarnation())
	}
}

// TestLostReplyResendIsDuplicateOnRealCoordinator: the real coordinator
// applies a request whose reply is lost (a proxy turns it into a 502); the
// client resends it with the same seqs and the coordinator drops it as a
// duplicate, so a store then delete is not replayed into a resurrected key.
func TestLostReplyResendIsDuplicateOnRealCoordinator(t *testing.T) {
	base := coordtest.Start(t, listen(t), nil)
	target, _ := url.Parse(base)
	var mu sync.Mutex
	lose := 1
	var replies []string
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error {
		if r.Request.URL.Path != "/events" {
			return nil
		}
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(raw)))
		mu.Lock()
		defer mu.Unlock()
		replies = append(replies, string(raw))
		if lose > 0 {
			lose--
			return errors.New("reply lost")
		}
		return nil
	}
	proxy.ErrorLog = nil
	proxy.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	front := httptest.NewServer(proxy)
	defer front.Close()
	c, err := coordclient.New(coordclient.Config{URL: front.URL, HTTPPort: 8080, InstanceID: "mp-l", EventReporting: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	l := c.Listener("fs", false)
	l.OnStored([]objkey.Key{key(t, 1), key(t, 2)}, []int64{1000, 24})
	l.OnDeleted([]objkey.Key{key(t, 1)})
	if err := c.Flush(context.Background()); err == nil {
		t.Fatal("flush with a lost reply should fail")
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := append([]string(nil), replies...)
	mu.Unlock()
	if len(got) != 2 || strings.TrimSpace(got[0]) != `{"applied":2,"duplicates":0,"stale":0}` || strings.TrimSpace(got[1]) != `{"applied":0,"duplicates":2,"stale":0}` {
		t.Fatalf("coordinator replies %q", got)
	}
	var q struct {
		TotalGB float64 `json:"total_gb"`
	}
	getJSON(t, base+"/quota", &q)
	if u := q.TotalGB * (1 << 30); math.Abs(u-24) > 0.5 {
		t.Fatalf("usage %v bytes, want 24", u)
	}
}

// TestStaleIncarnationEventsCountedDropped: the real coordinator has seen
// incarnation 200 of instance mp-st, so a client still on incarnation 100
// under that id gets its two batches (three events) answered stale. They
// were dropped there, so the client counts them as dropped (Dropped and
// lmcache_mp_coordinator_events_dropped_total, 3 each), keeps nothing to
// resend, and the coordinator's gate counted the two batches stale.
func TestStaleIncarnationEventsCountedDropped(t *testing.T) {
	base := coordtest.Start(t, listen(t), nil)
	newer, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8080, InstanceID: "mp-st", EventReporting: true, EventEndpoint: coordclient.EndpointEvents, Incarnation: 200, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	newer.Listener("fs", false).OnStored([]objkey.Key{key(t, 9)}, []int64{10})
	if err := newer.Flush(context.Background()); err != nil || newer.Dropped() != 0 {
		t.Fatalf("newer incarnation flush: %v, dropped %d", err, newer.Dropped())
	}
	m := mpmetrics.New("mp-st", nil)
	older, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8080, InstanceID: "mp-st", EventReporting: true, EventEndpoint: coordclient.EndpointEvents, Incarnation: 100, Metrics: m, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	l := older.Listener("fs", false)
	l.OnStored([]objkey.Key{key(t, 1), key(t, 2)}, []int64{100, 200})
	l.OnDeleted([]objkey.Key{key(t, 1)})
	if err := older.Flush(context.Background()); err != nil {
		t.Fatalf("a stale verdict is an answer, not a failure: %v", err)
	}
	if older.Dropped() != 3 || m.CoordEventsDropped.Value() != 3 || older.Pending() != 0 || older.SentBatches() != 1 || m.CoordBatchesFailed.Value() != 0 {
		t.Fatalf("dropped %d, metric %v, pending %d, sent %d, failed %v; want 3, 3, 0, 1, 0",
			older.Dropped(), m.CoordEventsDropped.Value(), older.Pending(), older.SentBatches(), m.CoordBatchesFailed.Value())
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `lmcache_coordinator_event_gate_batches_total{door="events",result="stale"} 2`; !strings.Contains(string(raw), want) {
		t.Fatalf("coordinator metrics lack %s", want)
	}
}
