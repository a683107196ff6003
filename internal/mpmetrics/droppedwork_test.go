package mpmetrics

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/mpmetrics/stats"
)

// TestEngineDroppedWorkExported: the engine's dropped-work counters are
// exported: prefetch jobs whose L2 phase never ran (queue_full) and
// finished jobs discarded unpolled, uploads abandoned per adapter and
// dropped at stop, and expired L1 leases by kind; POST /metrics/reset
// rebases them like the other counters.
func TestEngineDroppedWorkExported(t *testing.T) {
	c := stats.Counters{PrefetchDropped: 3, PrefetchReaped: 5, StoreQueueDropped: 7, L1ReadLeasesExpired: 11, L1WriteLeasesExpired: 13,
		L2: []stats.L2Counters{{Index: 0, TypeName: "s3", StoreAbandoned: 17}}}
	m := New("i-1", func() stats.Counters { return c })
	body := scrape(t, m)
	for _, want := range []string{
		`lmcache_mp_prefetch_dropped_jobs_total{reason="queue_full"} 3`,
		`lmcache_mp_prefetch_dropped_jobs_total{reason="unpolled"} 5`,
		`lmcache_mp_l2_store_dropped_objects_total 7`,
		`lmcache_mp_l1_expired_leases_total{kind="read"} 11`,
		`lmcache_mp_l1_expired_leases_total{kind="write"} 13`,
		`lmcache_mp_l2_store_abandoned_objects_total{l2_name="s3"} 17`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	m.Reset()
	c.PrefetchReaped, c.L2 = 9, []stats.L2Counters{{Index: 0, TypeName: "s3", StoreAbandoned: 20}}
	body = scrape(t, m)
	for _, want := range []string{`lmcache_mp_prefetch_dropped_jobs_total{reason="unpolled"} 4`, `lmcache_mp_l2_store_abandoned_objects_total{l2_name="s3"} 3`, `lmcache_mp_prefetch_dropped_jobs_total{reason="queue_full"} 0`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("after reset, scrape lacks %q", want)
		}
	}
}
