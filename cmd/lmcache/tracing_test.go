package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/serverconfig"
)

// TestDisableObservabilityTurnsTracingOff: with --enable-tracing and an
// endpoint, startTracing installs a provider; --disable-observability on
// top of the same flags leaves tracing off (an inert provider). The OTLP
// exporter connects lazily, so no collector is needed to tell the two
// apart; the enabled provider is shut down before the next start.
func TestDisableObservabilityTurnsTracingOff(t *testing.T) {
	for _, tc := range []struct {
		disable bool
		want    bool
	}{{false, true}, {true, false}} {
		cfg := &serverconfig.Config{EnableTracing: true, OTLPEndpoint: "http://127.0.0.1:4317", TraceLevel: "storage", DisableObservability: tc.disable}
		p, err := startTracing(context.Background(), cfg, "i-1", mpmetrics.New("i-1", nil), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("disable-observability %v: %v", tc.disable, err)
		}
		if got := p.Enabled(); got != tc.want {
			t.Errorf("disable-observability %v: tracing enabled %v, want %v", tc.disable, got, tc.want)
		}
		stopTracing(p)
	}
}
