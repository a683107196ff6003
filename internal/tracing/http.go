package tracing

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// HTTPHandler wraps a service's whole handler so each request is a
// top-level span named by its ServeMux pattern ("POST /api/kv/store";
// otelhttp renames the span once the mux has matched). With no active
// provider a request goes straight to h.
func HTTPHandler(h http.Handler) http.Handler {
	// The mux sets Pattern on the request it is given, so the route is
	// read after it returns, on that same request.
	routed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.Pattern != "" {
			trace.SpanFromContext(r.Context()).SetAttributes(semconv.HTTPRoute(routeOf(r.Pattern)))
		}
	})
	traced := otelhttp.NewHandler(routed, "http",
		otelhttp.WithTracerProvider(dynamicProvider{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern
			}
			return r.Method // unmatched (404/405): no route to name
		}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if active.Load() == nil {
			h.ServeHTTP(w, r)
			return
		}
		traced.ServeHTTP(w, r)
	})
}

// routeOf drops the method (and host) part of a ServeMux pattern.
func routeOf(pattern string) string {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return pattern
}

// dynamicProvider hands otelhttp a tracer that follows whichever provider
// is active when a request starts, since the handler is built before (or
// without) Start.
type dynamicProvider struct{ embedded.TracerProvider }

func (dynamicProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return dynamicTracer{} }

type dynamicTracer struct{ embedded.Tracer }

func (dynamicTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	st := active.Load()
	if st == nil {
		return ctx, noSpan
	}
	return st.tracer.Start(ctx, name, opts...)
}
