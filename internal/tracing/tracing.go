// Package tracing exports OpenTelemetry spans over OTLP/gRPC when
// `lmcache server --enable-tracing --otlp-endpoint URL` asks for it (upstream
// lmcache/v1/mp_observability: tracing needs an OTLP gRPC endpoint, e.g.
// http://localhost:4317). Metrics stay on Prometheus.
//
// One Provider is active per process at a time. Call sites (HTTP routes,
// ZMQ requests, L2 operations) start spans through the package functions,
// which return a no-op span without touching the context when no Provider is
// active, so the data path pays one atomic load when tracing is off.
//
// The trace level decides depth: "events" exports only the top-level request
// spans (HTTP routes, ZMQ requests); "storage" (the default) adds a child
// span per L2 adapter operation.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/logthrottle"
	"github.com/lmcache-go/lmcache/internal/redact"
)

// Level is how deep spans go.
type Level int

const (
	// LevelEvents exports top-level request spans only.
	LevelEvents Level = iota + 1
	// LevelStorage adds the L2 adapter operations under them.
	LevelStorage
)

// ParseLevel maps the --trace-level value to a Level.
func ParseLevel(s string) (Level, error) {
	switch s {
	case "events":
		return LevelEvents, nil
	case "storage", "":
		return LevelStorage, nil
	}
	return 0, fmt.Errorf("trace level %q: want storage or events", s)
}

// ErrNoEndpoint is returned when tracing is enabled without an endpoint;
// upstream refuses the same flags at startup.
var ErrNoEndpoint = errors.New("--enable-tracing requires --otlp-endpoint (an OTLP gRPC endpoint such as http://localhost:4317)")

// Config selects what Start sets up.
type Config struct {
	Enabled  bool
	Endpoint string
	Level    string
	// ServiceName, ServiceVersion and InstanceID become the resource's
	// service.name, service.version and service.instance.id.
	ServiceName    string
	ServiceVersion string
	InstanceID     string
	// Dropped, when set, is told how many spans were lost and why
	// ("export_failed": the collector refused or could not be reached;
	// "queue_full": OTEL_BSP_MAX_QUEUE_SIZE spans, 2048 by default, were
	// already waiting for export; "shutdown": the span ended once
	// Provider.Shutdown had begun, too late to be queued).
	Dropped func(reason string, n int)
	// Logger receives the OpenTelemetry SDK's own errors (a failed
	// export, an exporter that gave up) at WARN, at most one every
	// sdkErrorEvery with the count of those in between; nil uses
	// slog.Default(). Without it the SDK prints them through the standard
	// log package, one unstructured line each.
	Logger *slog.Logger
}

// Provider is the active tracer provider; Shutdown flushes and removes it.
type Provider struct {
	st *state
}

type state struct {
	tp     *sdktrace.TracerProvider
	adm    *admission
	tracer trace.Tracer
	level  Level
}

// active is the one installed provider; nil when tracing is off.
var active atomic.Pointer[state]

// Start validates cfg and, when tracing is enabled, installs a provider that
// batches spans to the OTLP gRPC endpoint. It does not wait for the
// collector: spans queue in the batch processor and export failures are
// counted through cfg.Dropped. With tracing disabled it returns an inert
// Provider.
func Start(ctx context.Context, cfg Config) (*Provider, error) {
	level, err := ParseLevel(cfg.Level)
	if err != nil {
		return nil, err
	}
	if !cfg.Enabled {
		return &Provider{}, nil
	}
	if cfg.Endpoint == "" {
		return nil, ErrNoEndpoint
	}
	opts, err := endpointOptions(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(cfg.ServiceName)}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, semconv.ServiceVersion(cfg.ServiceVersion))
	}
	if cfg.InstanceID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(cfg.InstanceID))
	}
	dropped := cfg.Dropped
	if dropped == nil {
		dropped = func(string, int) {}
	}
	adm := &admission{limit: int64(queueSize()), dropped: dropped}
	// The batch processor's own queue is twice the admission limit, so that
	// with at most that many spans admitted (queued, batched or exporting)
	// it never fills and drops a span without a count.
	adm.SpanProcessor = sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, dropped: dropped, done: adm.done},
		sdktrace.WithMaxQueueSize(2*int(adm.limit)))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(adm),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
	)
	st := &state{tp: tp, adm: adm, tracer: tp.Tracer("github.com/lmcache-go/lmcache"), level: level}
	if !active.CompareAndSwap(nil, st) {
		_ = tp.Shutdown(ctx)
		return nil, errors.New("tracing: a provider is already active in this process")
	}
	// Process-wide, like the provider: set only by the Start that won.
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	otel.SetErrorHandler(newSDKErrors(logger, sdkErrorEvery, time.Now))
	return &Provider{st: st}, nil
}

// endpointOptions turns upstream's endpoint forms into exporter options:
// "http://host:port" and a bare "host:port" are plaintext gRPC (upstream
// passes insecure=True), "https://host:port" uses TLS with the system roots.
//
// Errors quote the endpoint redacted: a URL's password (or url.Parse's
// error, which quotes the whole URL) would otherwise reach stderr.
func endpointOptions(ep string) ([]otlptracegrpc.Option, error) {
	hostport, secure := ep, false
	shown := redact.String(ep)
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return nil, fmt.Errorf("--otlp-endpoint %q: not a URL", shown)
		}
		switch u.Scheme {
		case "http":
		case "https":
			secure = true
		default:
			return nil, fmt.Errorf("--otlp-endpoint %q: scheme must be http or https", shown)
		}
		hostport = u.Host
	}
	if hostport == "" || strings.ContainsAny(hostport, "/?#") {
		return nil, fmt.Errorf("--otlp-endpoint %q: want host:port, http://host:port or https://host:port", shown)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(hostport)}
	if !secure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	return opts, nil
}

// Enabled reports whether a provider is active.
func (p *Provider) Enabled() bool { return p != nil && p.st != nil }

// Shutdown flushes queued spans (bounded by ctx) and uninstalls the
// provider. Safe on an inert Provider and when called twice. A span
// started before and ended during or after Shutdown is counted as dropped
// ("shutdown").
//
// It shuts down the span processor rather than the SDK's TracerProvider:
// TracerProvider.Shutdown unregisters its processors, after which a
// span's End reaches no processor and the span vanishes uncounted.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	active.CompareAndSwap(p.st, nil)
	if err := p.st.adm.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing shutdown: %w", err)
	}
	return nil
}

// noSpan is the non-recording span handed out when tracing is off.
var noSpan = trace.SpanFromContext(context.Background())

// Request starts a top-level span (an HTTP route or a ZMQ request), at every
// level. Without an active provider it returns ctx unchanged and a no-op span.
func Request(ctx context.Context, name string) (context.Context, trace.Span) {
	st := active.Load()
	if st == nil {
		return ctx, noSpan
	}
	return st.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
}

// Storage starts a storage-level span (an L2 operation); only at
// LevelStorage, otherwise it returns ctx unchanged and a no-op span.
func Storage(ctx context.Context, name string) (context.Context, trace.Span) {
	st := active.Load()
	if st == nil || st.level < LevelStorage {
		return ctx, noSpan
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if l := links(ctx); l != nil {
		opts = append(opts, trace.WithLinks(l...))
		ctx = context.WithValue(ctx, followKey{}, nil) // the links belong to this span, not to its children
	}
	return st.tracer.Start(ctx, name, opts...)
}

// End records err (if any) as the span's status and ends it.
func End(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Attribute keys carried by lmcache spans. None of them is a secret or a
// token id: counts, names and sizes only.
const (
	KeyModel     = attribute.Key("lmcache.model_name")
	KeyTokens    = attribute.Key("lmcache.num_tokens")
	KeyChunks    = attribute.Key("lmcache.num_chunks")
	KeyHitChunks = attribute.Key("lmcache.hit_chunks")
	KeyBytes     = attribute.Key("lmcache.bytes")
	KeyAdapter   = attribute.Key("lmcache.l2.adapter")
	KeyKeys      = attribute.Key("lmcache.l2.keys")
	KeyHitKeys   = attribute.Key("lmcache.l2.hit_keys")
	KeyWorldSize = attribute.Key("lmcache.world_size")
)

// queueSize is how many ended spans may wait for export (queued, in a
// batch or being exported) before new ones are dropped, counted as
// "queue_full": OTEL_BSP_MAX_QUEUE_SIZE when it is a positive integer, as
// for the SDK's batch processor, else the SDK's default (2048), and at
// most maxQueueSize.
func queueSize() int {
	if n, err := strconv.Atoi(os.Getenv("OTEL_BSP_MAX_QUEUE_SIZE")); err == nil && n > 0 {
		return min(n, maxQueueSize)
	}
	return sdktrace.DefaultMaxQueueSize
}

// maxQueueSize bounds OTEL_BSP_MAX_QUEUE_SIZE: the batch processor's
// queue is a channel of twice the size, allocated at start, so a value
// such as 2^40 would overflow the doubling or fail the allocation and
// crash the process before it serves; a million waiting spans is far more
// than any collector outage needs.
const maxQueueSize = 1 << 20

// admission is the span processor in front of the batch processor. The
// batch processor drops a span when its queue is full and only logs it
// (at debug level), so admission bounds the spans it hands over to
// limit and counts the ones it turns away. A span counts from its End
// until the export call that carried it returns (countingExporter calls
// done), whether the export succeeded or not.
type admission struct {
	sdktrace.SpanProcessor
	limit    int64
	inFlight atomic.Int64
	dropped  func(reason string, n int)
	// mu orders OnEnd against Shutdown: the batch processor silently
	// drops a span handed to it once its Shutdown has begun, so each
	// OnEnd checks closed and hands the span over under the read lock,
	// and Shutdown sets closed under the write lock before it starts.
	mu     sync.RWMutex
	closed bool
}

// OnEnd admits a sampled span or counts it dropped. Unsampled spans are
// passed through: the batch processor ignores them.
func (a *admission) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.SpanContext().IsSampled() {
		a.mu.RLock()
		defer a.mu.RUnlock()
		if a.closed {
			a.dropped("shutdown", 1)
			return
		}
		if a.inFlight.Add(1) > a.limit {
			a.inFlight.Add(-1)
			a.dropped("queue_full", 1)
			return
		}
	}
	a.SpanProcessor.OnEnd(s)
}

// Shutdown turns away spans that end from now on, counted as "shutdown",
// then flushes and stops the batch processor.
func (a *admission) Shutdown(ctx context.Context) error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	return a.SpanProcessor.Shutdown(ctx)
}

// done releases n exported (or failed) spans' places.
func (a *admission) done(n int) { a.inFlight.Add(-int64(n)) }

// countingExporter reports spans the collector did not take, so the loss
// shows in a Prometheus counter instead of only in an OTel log line, and
// tells admission each batch is finished.
type countingExporter struct {
	sdktrace.SpanExporter
	dropped func(reason string, n int)
	done    func(n int)
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.dropped("export_failed", len(spans))
	}
	e.done(len(spans))
	return err
}

// sdkErrorEvery is the least time between two logged SDK errors: with the
// collector down every batch fails (one every 5 s by default, more under
// load), and the loss is counted in the dropped-spans metric anyway.
const sdkErrorEvery = 10 * time.Second

// sdkErrors is the OpenTelemetry error handler Start installs: it logs the
// SDK's errors through the service's structured logger, throttled.
type sdkErrors struct {
	log   *slog.Logger
	every time.Duration
	warns *logthrottle.Limiter
}

func newSDKErrors(log *slog.Logger, every time.Duration, now func() time.Time) *sdkErrors {
	h := &sdkErrors{log: log, every: every, warns: logthrottle.New()}
	h.warns.SetClock(now)
	return h
}

// Handle implements otel.ErrorHandler.
func (h *sdkErrors) Handle(err error) {
	ok, skipped := h.warns.Allow("sdk", h.every)
	if !ok {
		return
	}
	h.log.Warn("opentelemetry error (logged at most every 10 s; lost spans are counted in the trace_spans_dropped_total metric)",
		"err", err, "not_logged_since_last", skipped)
}

// ShutdownTimeout bounds the flush on server stop.
const ShutdownTimeout = 5 * time.Second

// followKey carries the span contexts set by Follow.
type followKey struct{}

// Follow returns ctx carrying the request spans that asked for the work
// about to be done under it, so that work done later, on another goroutine
// (a prefetch job's L2 loads, a write-behind upload batching several
// commits), joins their traces: the next storage span started under the
// returned ctx has the first valid one as its parent and links the others.
// Invalid span contexts are ignored; with none valid, or with tracing off,
// ctx is returned unchanged.
func Follow(ctx context.Context, parents ...trace.SpanContext) context.Context {
	if active.Load() == nil {
		return ctx
	}
	var valid []trace.SpanContext
	for _, sc := range parents {
		if sc.IsValid() && !slices.ContainsFunc(valid, func(v trace.SpanContext) bool { return v.Equal(sc) }) {
			valid = append(valid, sc)
		}
	}
	if len(valid) == 0 {
		return ctx
	}
	ctx = trace.ContextWithSpanContext(ctx, valid[0])
	if len(valid) > 1 {
		ctx = context.WithValue(ctx, followKey{}, valid[1:])
	}
	return ctx
}

// links turns the extra parents Follow put on ctx into span links.
func links(ctx context.Context) []trace.Link {
	scs, _ := ctx.Value(followKey{}).([]trace.SpanContext)
	if len(scs) == 0 {
		return nil
	}
	out := make([]trace.Link, len(scs))
	for i, sc := range scs {
		out[i] = trace.Link{SpanContext: sc}
	}
	return out
}
