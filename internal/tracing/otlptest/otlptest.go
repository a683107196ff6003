// Package otlptest is a real OTLP/gRPC trace receiver for tests: a gRPC
// server on 127.0.0.1 implementing the collector TraceService, recording
// every span it is sent.
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
)

// Span is one received span, flattened: its name, its parent (empty for a
// root) and its attributes rendered as strings, plus its resource's.
type Span struct {
	Name     string
	TraceID  string
	SpanID   string
	ParentID string
	// Links are the span ids this span links to (other traces' requests
	// whose work it also did).
	Links    []string
	Attrs    map[string]string
	Resource map[string]string
}

// Receiver collects spans until the test ends.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// Addr is host:port of the listener.
	Addr string

	mu    sync.Mutex
	spans []Span
	seen  chan struct{} // signalled (non-blocking) on every export
	// held, while not nil, holds every Export until it is closed (Hold).
	held chan struct{}
}

// Hold makes every export wait, without taking its spans, until release
// is called (or the exporter gives up on the call), as a collector that
// has stopped reading would.
func (r *Receiver) Hold() (release func()) {
	ch := make(chan struct{})
	r.mu.Lock()
	r.held = ch
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.held = nil
			r.mu.Unlock()
			close(ch)
		})
	}
}

// Start listens on 127.0.0.1:0 and stops the server at test cleanup.
func Start(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Addr: ln.Addr().String(), seen: make(chan struct{}, 1)}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, r)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return r
}

// Export implements the collector TraceService.
func (r *Receiver) Export(ctx context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	held := r.held
	r.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				var links []string
				for _, l := range s.GetLinks() {
					links = append(links, hexOf(l.GetSpanId()))
				}
				r.spans = append(r.spans, Span{Name: s.GetName(), TraceID: hexOf(s.GetTraceId()), SpanID: hexOf(s.GetSpanId()),
					ParentID: hexOf(s.GetParentSpanId()), Links: links, Attrs: attrs(s.GetAttributes()), Resource: res})
			}
		}
	}
	r.mu.Unlock()
	select {
	case r.seen <- struct{}{}:
	default:
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Spans returns a copy of what arrived so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor polls until ok holds for the spans received, failing the test
// after timeout.
func (r *Receiver) WaitFor(t testing.TB, timeout time.Duration, what string, ok func([]Span) bool) []Span {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if s := r.Spans(); ok(s) {
			return s
		}
		select {
		case <-r.seen:
		case <-deadline.C:
			t.Fatalf("OTLP receiver: no %s within %v; got %v", what, timeout, names(r.Spans()))
			return nil
		}
	}
}

// Named returns the spans called name.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func names(spans []Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}
