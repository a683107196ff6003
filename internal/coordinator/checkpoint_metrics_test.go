package coordinator_test

import (
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestCheckpointLastMetricsExported: the checkpoint_last_* gauges and
// saves_total are on /metrics: all 0 before this process wrote one; after
// SaveCheckpoint, saves_total 1, last_size_bytes the payload size (the
// artifact less its 24-byte header, the same across two saves of the same
// ledger) and last_success_timestamp_seconds the save's wall time.
func TestCheckpointLastMetricsExported(t *testing.T) {
	path, _ := checkpointFixture(t)
	c := startCoord(t, func(cfg *config.Config) { cfg.Ingest.CheckpointPath = path; cfg.Ingest.CheckpointInterval = 0 })
	for _, name := range []string{"lmcache_coordinator_checkpoint_saves_total", "lmcache_coordinator_checkpoint_save_failures_total",
		"lmcache_coordinator_checkpoint_last_duration_seconds", "lmcache_coordinator_checkpoint_last_size_bytes",
		"lmcache_coordinator_checkpoint_last_success_timestamp_seconds"} {
		if got := c.metric(name); got != 0 {
			t.Errorf("%s = %v before any save, want 0", name, got)
		}
	}
	before := time.Now()
	if err := c.srv.SaveCheckpoint(); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.metric("lmcache_coordinator_checkpoint_saves_total"); got != 1 {
		t.Errorf("saves_total %v, want 1", got)
	}
	size := c.metric("lmcache_coordinator_checkpoint_last_size_bytes")
	// The artifact is a 24-byte header (magic, version, payload length,
	// CRC) and the payload; the header's length field must agree.
	if payload := binary.LittleEndian.Uint64(raw[12:20]); size != float64(len(raw)-24) || size != float64(payload) {
		t.Errorf("last_size_bytes %v, want %d (the artifact's %d bytes less the 24-byte header; header says %d)", size, len(raw)-24, len(raw), payload)
	}
	if err := c.srv.SaveCheckpoint(); err != nil {
		t.Fatal(err)
	}
	if got := c.metric("lmcache_coordinator_checkpoint_last_size_bytes"); got != size {
		t.Errorf("last_size_bytes %v after a second save of the same ledger, want %v", got, size)
	}
	if got := c.metric("lmcache_coordinator_checkpoint_saves_total"); got != 2 {
		t.Errorf("saves_total %v, want 2", got)
	}
	ts := c.metric("lmcache_coordinator_checkpoint_last_success_timestamp_seconds")
	if ts < float64(before.Unix()) || ts > float64(after.Unix()+1) {
		t.Errorf("last_success_timestamp_seconds %v, want within the saves [%d, %d]", ts, before.Unix(), after.Unix()+1)
	}
	if got := c.metric("lmcache_coordinator_checkpoint_last_duration_seconds"); got < 0 {
		t.Errorf("last_duration_seconds %v, want >= 0", got)
	}
}
