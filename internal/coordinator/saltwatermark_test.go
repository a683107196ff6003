package coordinator_test

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestSaltEvictionThresholdMetric: lmcache_coordinator_salt_eviction_threshold_bytes
// is trigger_watermark × the salt's limit (its quota, else the default),
// for exactly the salts salt_usage_bytes lists (top --metrics-top-salts by
// usage) that have a limit; a salt with neither a quota nor a default has
// no series.
func TestSaltEvictionThresholdMetric(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.MetricsTopSalts = 2; cfg.TriggerWatermark = 0.5 })
	c.events(ev("store", "01", "a", 100), ev("store", "02", "b", 300), ev("store", "03", "c", 200))
	c.must("PUT", "/quota/b", map[string]any{"limit_gb": 1}, 200)
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 1}, 200) // a is cut by the top-2 bound
	metrics := func() string {
		_, raw := c.do("GET", "/metrics", nil)
		return string(raw)
	}
	text := metrics()
	for _, want := range []string{
		`lmcache_coordinator_salt_usage_bytes{cache_salt="b"} 300`,
		`lmcache_coordinator_salt_usage_bytes{cache_salt="c"} 200`,
		`lmcache_coordinator_salt_eviction_threshold_bytes{cache_salt="b"} 5.36870912e+08`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("missing %q in\n%s", want, text)
		}
	}
	if n := strings.Count(text, "lmcache_coordinator_salt_eviction_threshold_bytes{"); n != 1 {
		t.Errorf("%d threshold series, want 1 (b; c has no limit, a is not in the top 2)", n)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 2}, 200)
	text = metrics()
	if !strings.Contains(text, `lmcache_coordinator_salt_eviction_threshold_bytes{cache_salt="c"} 1.073741824e+09`+"\n") ||
		strings.Count(text, "lmcache_coordinator_salt_eviction_threshold_bytes{") != 2 {
		t.Errorf("after a default limit of 2 GB, want c at 1073741824 too:\n%s", text)
	}
}

// TestDroppedSpansCounted: spans the OTLP exporter lost (tracing.Config.Dropped,
// wired to CountDroppedSpans by `lmcache coordinator`) show on /metrics; the
// export_failed, queue_full and shutdown series exist at 0 before any loss.
func TestDroppedSpansCounted(t *testing.T) {
	c := startCoord(t, nil)
	metric(t, c, `lmcache_coordinator_trace_spans_dropped_total{reason="export_failed"} 0`)
	metric(t, c, `lmcache_coordinator_trace_spans_dropped_total{reason="queue_full"} 0`)
	metric(t, c, `lmcache_coordinator_trace_spans_dropped_total{reason="shutdown"} 0`)
	c.srv.CountDroppedSpans("export_failed", 3)
	c.srv.CountDroppedSpans("export_failed", 4)
	metric(t, c, `lmcache_coordinator_trace_spans_dropped_total{reason="export_failed"} 7`)
}
