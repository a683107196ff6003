package mpmetrics

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/mpmetrics/stats"
)

// TestL2EvictionDeleteFailuresExported: the engine's per-adapter count of
// failed eviction deletes is lmcache_mp_l2_eviction_delete_failures_total
// {l2_name}, with the same duplicate-name rule as the other L2 counters,
// and POST /metrics/reset rebases it like them.
func TestL2EvictionDeleteFailuresExported(t *testing.T) {
	c := stats.Counters{L2: []stats.L2Counters{
		{Index: 0, TypeName: "fs", EvictionDeleteFailed: 4},
		{Index: 1, TypeName: "fs", EvictionDeleteFailed: 0},
	}}
	m := New("i-1", func() stats.Counters { return c })
	body := scrape(t, m)
	for _, want := range []string{`lmcache_mp_l2_eviction_delete_failures_total{l2_name="fs"} 4`, `lmcache_mp_l2_eviction_delete_failures_total{l2_name="fs_1"} 0`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	m.Reset()
	// A new slice: the baseline holds the old one.
	c.L2 = []stats.L2Counters{{Index: 0, TypeName: "fs", EvictionDeleteFailed: 7}, {Index: 1, TypeName: "fs"}}
	if want := `lmcache_mp_l2_eviction_delete_failures_total{l2_name="fs"} 3`; !strings.Contains(scrape(t, m), want+"\n") {
		t.Errorf("after reset, scrape lacks %q", want)
	}
}
