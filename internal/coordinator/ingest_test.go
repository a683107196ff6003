package coordinator_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator"
)

// TestIngestCacheEventsMatchesHTTPDoor: the non-HTTP entry point (for a
// Kafka source) shares the /events gate: a record replayed after an HTTP
// post of the same batch is a duplicate, and a bad record is rejected with
// ErrValidation and nothing applied.
func TestIngestCacheEventsMatchesHTTPDoor(t *testing.T) {
	c := startCoord(t, nil)
	b := cacheBatch("mp-k", 3, 1, "store", "l2", "s3", "kf", "aa", 77)
	wantReply(t, c.postEvents(b), 1, 0, 0)
	rec, _ := json.Marshal(map[string]any{"batches": []any{b, cacheBatch("mp-k", 3, 2, "store", "l2", "s3", "kf", "bb", 23)}})
	a, d, s, err := c.srv.IngestCacheEvents(rec)
	if err != nil || a != 1 || d != 1 || s != 0 {
		t.Fatalf("ingest = %d %d %d, %v; want 1 applied, 1 duplicate", a, d, s, err)
	}
	if u := c.usageBytes("kf"); u != 100 {
		t.Fatalf("usage %d, want 100", u)
	}
	bad, _ := json.Marshal(map[string]any{"batches": []any{cacheBatch("mp-k", 3, 3, "store", "l2", "s3", "kf", "cc", 5), cacheBatch("mp-k", 3, 4, "store", "l2", "s3", "kf", "zz", 5)}})
	if _, _, _, err := c.srv.IngestCacheEvents(bad); !errors.Is(err, coordinator.ErrValidation) {
		t.Fatalf("bad record: %v", err)
	}
	if u := c.usageBytes("kf"); u != 100 {
		t.Fatalf("rejected record applied: %d", u)
	}
}
