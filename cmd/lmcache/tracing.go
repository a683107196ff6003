package main

import (
	"context"
	"log/slog"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/serverconfig"
	"github.com/lmcache-go/lmcache/internal/tracing"
)

// startTracing hands the three tracing flags to the tracing package; lost
// spans are counted in lmcache_mp_trace_spans_dropped_total.
func startTracing(ctx context.Context, cfg *serverconfig.Config, instanceID string, metrics *mpmetrics.Metrics, log *slog.Logger) (*tracing.Provider, error) {
	return tracing.Start(ctx, tracing.Config{
		Enabled: cfg.EnableTracing && !cfg.DisableObservability, Endpoint: cfg.OTLPEndpoint, Level: cfg.TraceLevel,
		ServiceName: "lmcache-mp-server", ServiceVersion: buildinfo.Labels()["version"], InstanceID: instanceID,
		Dropped: func(reason string, n int) { metrics.TraceSpansDropped.WithLabelValues(reason).Add(float64(n)) },
		Logger:  log,
	})
}

// stopTracing flushes queued spans, bounded by tracing.ShutdownTimeout.
func stopTracing(p *tracing.Provider) {
	ctx, cancel := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
	defer cancel()
	_ = p.Shutdown(ctx)
}
