package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/tracing"
	"github.com/lmcache-go/lmcache/internal/tracing/otlptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, rcv *otlptest.Receiver, level string) *tracing.Provider {
	t.Helper()
	p, err := tracing.Start(context.Background(), tracing.Config{Enabled: true, Endpoint: "http://" + rcv.Addr, Level: level,
		ServiceName: "lmcache-mp-server", ServiceVersion: "v9.9.9", InstanceID: "inst-1"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestStartValidates: upstream's rule that tracing needs an endpoint, the
// endpoint forms, and the level values.
func TestStartValidates(t *testing.T) {
	if _, err := tracing.Start(context.Background(), tracing.Config{Enabled: true}); !errors.Is(err, tracing.ErrNoEndpoint) {
		t.Fatalf("enabled without endpoint: %v, want ErrNoEndpoint", err)
	}
	for _, ep := range []string{"ftp://h:1", "http://", "http:///v1/traces", "h:1/x"} {
		if _, err := tracing.Start(context.Background(), tracing.Config{Enabled: true, Endpoint: ep}); err == nil {
			t.Errorf("endpoint %q accepted", ep)
		}
	}
	if _, err := tracing.Start(context.Background(), tracing.Config{Level: "deep"}); err == nil {
		t.Error("level deep accepted")
	}
	p, err := tracing.Start(context.Background(), tracing.Config{Endpoint: "http://127.0.0.1:1"})
	if err != nil || p.Enabled() {
		t.Fatalf("disabled: %v enabled=%v", err, p.Enabled())
	}
	ctx := context.Background()
	if got, span := tracing.Request(ctx, "x"); got != ctx || span.IsRecording() {
		t.Error("a span recorded with tracing off")
	}
}

// TestBadEndpointErrorHidesPassword: an --otlp-endpoint refused at start
// is quoted in its error (which reaches stderr) with its password
// redacted, whether the scheme, the host or url.Parse refused it.
func TestBadEndpointErrorHidesPassword(t *testing.T) {
	for _, ep := range []string{"ftp://u:s3cret-pw@h:1", "http://u:s3cret-pw@/v1", "http://u:s3cret-pw@h:1/%zz"} {
		_, err := tracing.Start(context.Background(), tracing.Config{Enabled: true, Endpoint: ep})
		if err == nil || strings.Contains(err.Error(), "s3cret-pw") || !strings.Contains(err.Error(), "--otlp-endpoint") {
			t.Errorf("endpoint %q: error %v, want a refusal naming --otlp-endpoint without the password", ep, err)
		}
	}
}

// TestSpansReachReceiver: a request span and its storage child arrive over
// OTLP/gRPC with names, attributes, parentage and the resource; Shutdown
// flushes them.
func TestSpansReachReceiver(t *testing.T) {
	rcv := otlptest.Start(t)
	p := start(t, rcv, "storage")
	ctx, span := tracing.Request(context.Background(), "LOOKUP")
	span.SetAttributes(tracing.KeyModel.String("m"), tracing.KeyTokens.Int(512))
	_, child := tracing.Storage(ctx, "l2.lookup")
	tracing.End(child, errors.New("boom"))
	tracing.End(span, nil)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.WaitFor(t, 10*time.Second, "two spans", func(s []otlptest.Span) bool { return len(s) == 2 })
	look, l2 := otlptest.Named(spans, "LOOKUP"), otlptest.Named(spans, "l2.lookup")
	if len(look) != 1 || len(l2) != 1 {
		t.Fatalf("spans %+v", spans)
	}
	if look[0].Attrs["lmcache.model_name"] != "m" || look[0].Attrs["lmcache.num_tokens"] != "512" || look[0].ParentID != "" {
		t.Errorf("LOOKUP span %+v", look[0])
	}
	if l2[0].ParentID != look[0].SpanID || l2[0].TraceID != look[0].TraceID {
		t.Errorf("l2.lookup not a child of LOOKUP: %+v", l2[0])
	}
	res := look[0].Resource
	if res["service.name"] != "lmcache-mp-server" || res["service.version"] != "v9.9.9" || res["service.instance.id"] != "inst-1" {
		t.Errorf("resource %v", res)
	}
	// After Shutdown nothing records and a second Shutdown is harmless.
	if _, s := tracing.Request(context.Background(), "late"); s.IsRecording() {
		t.Error("span recorded after Shutdown")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("second shutdown: %v", err)
	}
}

// TestEventsLevelTopOnly: at level events only request spans are made.
func TestEventsLevelTopOnly(t *testing.T) {
	rcv := otlptest.Start(t)
	p := start(t, rcv, "events")
	ctx, span := tracing.Request(context.Background(), "COMMIT_STORE")
	if _, child := tracing.Storage(ctx, "l2.store"); child.IsRecording() {
		t.Error("storage span recorded at level events")
	}
	tracing.End(span, nil)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.WaitFor(t, 10*time.Second, "one span", func(s []otlptest.Span) bool { return len(s) >= 1 })
	if len(spans) != 1 || spans[0].Name != "COMMIT_STORE" {
		t.Fatalf("spans %+v", spans)
	}
}

// TestFollowParentsAndLinks: work done later for several requests (one
// upload batch of two commits) is a child of the first request and links
// the second; a span started under that child links nothing; with no valid
// parent Follow leaves the context alone.
func TestFollowParentsAndLinks(t *testing.T) {
	rcv := otlptest.Start(t)
	p := start(t, rcv, "storage")
	_, a := tracing.Request(context.Background(), "COMMIT_STORE")
	_, b := tracing.Request(context.Background(), "COMMIT_STORE")
	tracing.End(a, nil)
	tracing.End(b, nil)
	bg := context.Background()
	if got := tracing.Follow(bg, trace.SpanContext{}); got != bg {
		t.Error("Follow with no valid parent changed the context")
	}
	ctx, up := tracing.Storage(tracing.Follow(bg, a.SpanContext(), b.SpanContext(), a.SpanContext()), "l2.store")
	_, inner := tracing.Storage(ctx, "l2.inner")
	tracing.End(inner, nil)
	tracing.End(up, nil)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.WaitFor(t, 10*time.Second, "four spans", func(s []otlptest.Span) bool { return len(s) == 4 })
	st, in := otlptest.Named(spans, "l2.store"), otlptest.Named(spans, "l2.inner")
	if len(st) != 1 || len(in) != 1 {
		t.Fatalf("spans %+v", spans)
	}
	aID, bID := a.SpanContext().SpanID().String(), b.SpanContext().SpanID().String()
	if st[0].ParentID != aID || st[0].TraceID != a.SpanContext().TraceID().String() || fmt.Sprint(st[0].Links) != "["+bID+"]" {
		t.Errorf("l2.store parent %s links %v, want parent %s links [%s]", st[0].ParentID, st[0].Links, aID, bID)
	}
	if in[0].ParentID != st[0].SpanID || len(in[0].Links) != 0 {
		t.Errorf("l2.inner parent %s links %v, want parent %s and no links", in[0].ParentID, in[0].Links, st[0].SpanID)
	}
}

// TestHTTPHandlerNamesRoute: the wrapped handler's span is named by the
// ServeMux pattern, with the route and status attributes.
func TestHTTPHandlerNamesRoute(t *testing.T) {
	rcv := otlptest.Start(t)
	p := start(t, rcv, "storage")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/kv/{op}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	srv := httptest.NewServer(tracing.HTTPHandler(mux))
	resp, err := http.Post(srv.URL+"/api/kv/store", "application/octet-stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	srv.Close()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.WaitFor(t, 10*time.Second, "the HTTP span", func(s []otlptest.Span) bool { return len(s) >= 1 })
	got := otlptest.Named(spans, "POST /api/kv/{op}")
	if len(got) != 1 {
		t.Fatalf("spans %+v", spans)
	}
	if got[0].Attrs["http.route"] != "/api/kv/{op}" || got[0].Attrs["http.response.status_code"] != "201" {
		t.Errorf("attrs %v", got[0].Attrs)
	}
}

// TestExportFailureCounted: spans the collector cannot take are reported
// to Dropped.
func TestExportFailureCounted(t *testing.T) {
	dropped := 0
	exportToDeadCollector(t, tracing.Config{Dropped: func(reason string, n int) {
		if reason == "export_failed" {
			dropped += n
		}
	}})
	if dropped != 1 {
		t.Fatalf("dropped = %d, want 1", dropped)
	}
}

// TestQueueFullCounted: with the collector holding the first export, at
// most OTEL_BSP_MAX_QUEUE_SIZE ended spans wait (queued, batched or being
// exported) and every further one is reported to Dropped as queue_full,
// exactly; once the collector reads again, every admitted span arrives and
// none is counted as an export failure.
func TestQueueFullCounted(t *testing.T) {
	const limit, extra = 64, 10
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "64")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "16")
	rcv := otlptest.Start(t)
	release := rcv.Hold()
	defer release()
	var queueFull, failed atomic.Int64
	p, err := tracing.Start(context.Background(), tracing.Config{Enabled: true, Endpoint: "http://" + rcv.Addr,
		Dropped: func(reason string, n int) {
			switch reason {
			case "queue_full":
				queueFull.Add(int64(n))
			case "export_failed":
				failed.Add(int64(n))
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range limit + extra {
		_, span := tracing.Request(context.Background(), fmt.Sprintf("span-%d", i))
		tracing.End(span, nil)
	}
	if got := queueFull.Load(); got != extra {
		t.Fatalf("queue_full = %d after %d spans with %d admitted, want %d", got, limit+extra, limit, extra)
	}
	release()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rcv.Spans(); len(got) != limit || got[0].Name != "span-0" {
		t.Fatalf("%d spans arrived (first %v), want the %d admitted", len(got), got[:min(1, len(got))], limit)
	}
	if queueFull.Load() != extra || failed.Load() != 0 {
		t.Fatalf("after the flush: queue_full %d, export_failed %d; want %d and 0", queueFull.Load(), failed.Load(), extra)
	}
}

// TestSpanEndedAfterShutdownCounted: a span started before Shutdown and
// ended after it cannot be exported; it is reported to Dropped as
// "shutdown", exactly once, and nothing else is counted. The old Shutdown
// unregistered the span processors, so the late span reached none and was
// lost uncounted.
func TestSpanEndedAfterShutdownCounted(t *testing.T) {
	rcv := otlptest.Start(t)
	var mu sync.Mutex
	counts := map[string]int{}
	p, err := tracing.Start(context.Background(), tracing.Config{Enabled: true, Endpoint: "http://" + rcv.Addr,
		Dropped: func(reason string, n int) {
			mu.Lock()
			counts[reason] += n
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	_, early := tracing.Request(context.Background(), "early")
	tracing.End(early, nil)
	_, late := tracing.Request(context.Background(), "late")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	tracing.End(late, nil)
	mu.Lock()
	got := fmt.Sprint(counts)
	mu.Unlock()
	if got != "map[shutdown:1]" {
		t.Fatalf("dropped = %s, want map[shutdown:1]", got)
	}
	if spans := rcv.Spans(); len(spans) != 1 || spans[0].Name != "early" {
		t.Fatalf("received %+v, want only the span ended before Shutdown", spans)
	}
}

// jsonRecords decodes a JSON slog handler's output, one record per line.
func jsonRecords(t *testing.T, raw string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(raw), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON log record: %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// TestSDKErrorsThrottled: the SDK error handler logs the first error at
// WARN, drops those within the interval and logs the next one after it
// with the number it did not log.
func TestSDKErrorsThrottled(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_000_000, 0)
	h := tracing.NewSDKErrors(slog.New(slog.NewJSONHandler(&buf, nil)), 10*time.Second, func() time.Time { return now })
	h.Handle(errors.New("e1"))
	now = now.Add(time.Second)
	h.Handle(errors.New("e2"))
	now = now.Add(8 * time.Second)
	h.Handle(errors.New("e3"))
	now = now.Add(time.Second)
	h.Handle(errors.New("e4"))
	recs := jsonRecords(t, buf.String())
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2 (e1 and e4):\n%s", len(recs), buf.String())
	}
	for i, want := range []struct {
		err     string
		skipped float64
	}{{"e1", 0}, {"e4", 2}} {
		if recs[i]["level"] != "WARN" || recs[i]["err"] != want.err || recs[i]["not_logged_since_last"] != want.skipped ||
			!strings.HasPrefix(recs[i]["msg"].(string), "opentelemetry error") {
			t.Errorf("record %d = %v, want WARN %s with %v not logged", i, recs[i], want.err, want.skipped)
		}
	}
}

// TestSDKErrorsGoToTheLogger: a failed export to a dead collector is
// logged through Config.Logger as a structured WARN record, and nothing
// reaches the standard log package (the SDK's default handler).
func TestSDKErrorsGoToTheLogger(t *testing.T) {
	var std, buf bytes.Buffer
	log.SetOutput(&std)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	exportToDeadCollector(t, tracing.Config{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	recs := jsonRecords(t, buf.String())
	if len(recs) != 1 || recs[0]["level"] != "WARN" || !strings.Contains(fmt.Sprint(recs[0]["err"]), "traces export") {
		t.Fatalf("logger got %v, want one WARN record of the failed export", recs)
	}
	if std.Len() != 0 {
		t.Fatalf("the standard log got %q", std.String())
	}
}

// exportToDeadCollector starts tracing with cfg aimed at a port nobody
// listens on, ends one span and shuts down, which waits for its failed
// export (given up after 300 ms).
func exportToDeadCollector(t *testing.T, cfg tracing.Config) {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "300") // ms
	cfg.Enabled, cfg.Endpoint = true, "127.0.0.1:1"
	p, err := tracing.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tracing.Request(context.Background(), "LOOKUP")
	tracing.End(span, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = p.Shutdown(ctx) // the failed export's error may surface here
}
