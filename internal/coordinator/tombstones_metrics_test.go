package coordinator

import "testing"

// TestTombstonesDroppedExported: event_tombstones_dropped_total{reason} is
// on /metrics for both reasons. With the bound lowered to 1, a batch
// deleting two unknown keys keeps one tombstone and drops one for
// capacity; a store an hour and more of event time later expires the kept
// one.
func TestTombstonesDroppedExported(t *testing.T) {
	s, base := tombCoord(t, nil)
	wantSample(t, base, `lmcache_coordinator_event_tombstones_dropped_total{reason="capacity"}`, "0")
	wantSample(t, base, `lmcache_coordinator_event_tombstones_dropped_total{reason="expired"}`, "0")
	s.tombs.mu.Lock()
	s.tombs.max = 1
	s.tombs.mu.Unlock()
	postBatches(t, base, tombBatch("mp-b", 1, "delete", tsBase+10, hashK, 0, hashJ, 0))
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "1")
	wantSample(t, base, `lmcache_coordinator_event_tombstones_dropped_total{reason="capacity"}`, "1")
	wantSample(t, base, `lmcache_coordinator_event_tombstones_dropped_total{reason="expired"}`, "0")
	const hashL = "0303030303030303030303030303030303030303030303030303030303030303"
	postBatches(t, base, tombBatch("mp-a", 1, "store", tsBase+10+tombstoneTTL+1, hashL, 7))
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "0")
	wantSample(t, base, `lmcache_coordinator_event_tombstones_dropped_total{reason="capacity"}`, "1")
	wantSample(t, base, `lmcache_coordinator_event_tombstones_dropped_total{reason="expired"}`, "1")
}
