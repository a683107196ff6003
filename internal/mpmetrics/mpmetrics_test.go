package mpmetrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/mpmetrics/stats"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestEngineCountersRebaseOnReset(t *testing.T) {
	c := stats.Counters{
		L1UsedBytes: 512, L1TotalBytes: 1024, L1Write: map[string]int64{"a": 5},
		L1EvictionLoopTicks: 7, L2: []stats.L2Counters{{Index: 0, TypeName: "s3", StoreCompleted: 3, UsageBytes: 99}, {Index: 1, TypeName: "s3", StoreCompleted: 1}},
	}
	m := New("i-1", func() stats.Counters { return c })
	body := scrape(t, m)
	for _, want := range []string{
		"lmcache_mp_l1_usage_ratio 0.5", `lmcache_mp_l1_write_chunks_total{cache_salt="a"} 5`, "lmcache_mp_l1_eviction_loop_ticks_total 7",
		`lmcache_mp_l2_store_completed_requests_total{l2_name="s3"} 3`, `lmcache_mp_l2_store_completed_requests_total{l2_name="s3_1"} 1`,
		`lmcache_mp_l2_usage_bytes{l2_name="s3"} 99`, `target_info{service_instance_id="i-1",service_name="lmcache-mp"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	m.Reset()
	c.L1Write = map[string]int64{"a": 6}
	c.L1EvictionLoopTicks = 9
	body = scrape(t, m)
	for _, want := range []string{`lmcache_mp_l1_write_chunks_total{cache_salt="a"} 1`, "lmcache_mp_l1_eviction_loop_ticks_total 2", "lmcache_mp_l1_memory_usage_bytes 512"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("after reset, scrape lacks %q", want)
		}
	}
	m.CoordEventsDropped.Add(3)
	if !strings.Contains(scrape(t, m), "lmcache_mp_coordinator_events_dropped_total 3\n") {
		t.Error("dropped counter missing")
	}
	m.Reset()
	if m.CoordEventsDropped.Value() != 0 {
		t.Error("own counter not reset")
	}
}

// TestLookupTimeoutMetric: lookups answered without L2 because the lookup
// budget ran out are exported as l2_prefetch_failure{reason=lookup_timeout}.
func TestLookupTimeoutMetric(t *testing.T) {
	c := stats.Counters{L2LookupTimeouts: 4, L2LookupUnavailable: 2, L2PrefetchFailOOM: 1}
	m := New("i-1", func() stats.Counters { return c })
	body := scrape(t, m)
	for _, want := range []string{`lmcache_mp_l2_prefetch_failure_total{reason="lookup_timeout"} 4`, `lmcache_mp_l2_prefetch_failure_total{reason="l1_oom"} 1`, `lmcache_mp_l2_prefetch_failure_total{reason="adapter_unavailable"} 2`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
}
