package mpmetrics

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mpmetrics/stats"
)

// TestL2BreakerStateGauge: each adapter's breaker state is exported as
// lmcache_mp_l2_breaker_state{l2_name, adapter_index} with the snapshot's
// value (0 closed, 1 open, 2 half-open).
func TestL2BreakerStateGauge(t *testing.T) {
	c := stats.Counters{L2: []stats.L2Counters{
		{Index: 0, TypeName: "s3", BreakerState: 1}, {Index: 1, TypeName: "s3", BreakerState: 2}, {Index: 2, TypeName: "fs"},
	}}
	body := scrape(t, New("i-1", func() stats.Counters { return c }))
	for _, want := range []string{
		`lmcache_mp_l2_breaker_state{adapter_index="0",l2_name="s3"} 1`,
		`lmcache_mp_l2_breaker_state{adapter_index="1",l2_name="s3_1"} 2`,
		`lmcache_mp_l2_breaker_state{adapter_index="2",l2_name="fs"} 0`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

// TestLookupDurationHistogram: RecordLookup observes the lookup's Duration
// in lmcache_mp_lookup_duration_seconds (bucketed), skips a zero Duration,
// and Reset empties the histogram (still exported, with a zero count).
func TestLookupDurationHistogram(t *testing.T) {
	m := New("i-1", nil)
	if body := scrape(t, m); !strings.Contains(body, "lmcache_mp_lookup_duration_seconds_count 0\n") {
		t.Errorf("before any lookup the histogram is not exported empty")
	}
	m.RecordLookup("m", "", 256, 4, LookupResult{PrefixChunks: 2, Duration: 3 * time.Millisecond})
	m.RecordLookup("m", "", 256, 4, LookupResult{PrefixChunks: 4, Duration: 2 * time.Second})
	m.RecordLookup("m", "", 256, 4, LookupResult{PrefixChunks: 4}) // no duration: counted, not observed
	body := scrape(t, m)
	for _, want := range []string{
		`lmcache_mp_lookup_duration_seconds_bucket{le="0.0025"} 0`,
		`lmcache_mp_lookup_duration_seconds_bucket{le="0.005"} 1`,
		`lmcache_mp_lookup_duration_seconds_bucket{le="1"} 1`,
		`lmcache_mp_lookup_duration_seconds_bucket{le="2.5"} 2`,
		`lmcache_mp_lookup_duration_seconds_bucket{le="+Inf"} 2`,
		`lmcache_mp_lookup_duration_seconds_sum 2.003`,
		`lmcache_mp_lookup_duration_seconds_count 2`,
		`lmcache_mp_lookups_requests_total{cache_salt="",model_name="m"} 3`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	m.Reset()
	if body := scrape(t, m); !strings.Contains(body, "lmcache_mp_lookup_duration_seconds_count 0\n") {
		t.Errorf("after reset the histogram is not empty")
	}
}

// TestLookupDurationBuckets: lmcache_mp_lookup_duration_seconds has exactly
// the documented buckets, 100 µs to 10 s (then +Inf), in this order.
func TestLookupDurationBuckets(t *testing.T) {
	const prefix = `lmcache_mp_lookup_duration_seconds_bucket{le="`
	var got []string
	for line := range strings.Lines(scrape(t, New("i-1", nil))) {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			le, _, _ := strings.Cut(rest, `"`)
			got = append(got, le)
		}
	}
	want := []string{"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"}
	if !slices.Equal(got, want) {
		t.Fatalf("buckets %q\nwant    %q", got, want)
	}
}
