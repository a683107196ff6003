package mpmetrics

import (
	"slices"
	"strings"
	"testing"
)

// TestKVEventsCountersKeepUnitsApart: KVEventsDrop adds events to
// lmcache_mp_kv_events_dropped_total{reason}, KVEventsReplayFailed adds
// one request to lmcache_mp_kv_events_replay_requests_failed_total{reason},
// neither touches the other's counter, and Reset empties both.
func TestKVEventsCountersKeepUnitsApart(t *testing.T) {
	m := New("i-1", nil)
	m.KVEventsDrop("publisher_queue_full", 5)
	m.KVEventsDrop("publisher_queue_full", 2)
	m.KVEventsReplayFailed("invalid")
	m.KVEventsReplayFailed("aborted")
	m.KVEventsReplayFailed("aborted")
	want := []string{
		`lmcache_mp_kv_events_dropped_total{reason="publisher_queue_full"} 7`,
		`lmcache_mp_kv_events_replay_requests_failed_total{reason="aborted"} 2`,
		`lmcache_mp_kv_events_replay_requests_failed_total{reason="invalid"} 1`,
	}
	if got := kvEventSamples(scrape(t, m)); !slices.Equal(got, want) {
		t.Errorf("kv_events samples %q, want %q", got, want)
	}
	m.Reset()
	if got := kvEventSamples(scrape(t, m)); len(got) != 0 {
		t.Errorf("after reset kv_events samples %q, want none", got)
	}
}

// kvEventSamples are the lmcache_mp_kv_events_* sample lines of body.
func kvEventSamples(body string) []string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, Namespace+"_kv_events_") {
			out = append(out, line)
		}
	}
	return out
}
