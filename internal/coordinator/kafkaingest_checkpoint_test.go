package coordinator_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// checkpointFixture posts events into a coordinator with a checkpoint path,
// stops it cleanly (the final checkpoint) and returns the path and the
// artifact's bytes.
func checkpointFixture(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "coord.ckpt")
	c := startCoord(t, func(cfg *config.Config) { cfg.Ingest.CheckpointPath = path; cfg.Ingest.CheckpointInterval = 0 })
	h := func(n int) string { return strings.Repeat("0", 62) + string("0123456789abcdef"[n]) + "0" }
	wantReply(t, c.postEvents(
		cacheBatch("mp-a", 1, 1, "store", "l2", "fs", "a", h(1), 100, h(2), 200, h(3), 300),
		cacheBatch("mp-b", 4, 7, "store", "l2", "fs", "b", h(4), 50),
		cacheBatch("mp-a", 1, 2, "delete", "l2", "fs", "a", h(2), 200),
		// A re-store moves h(1) to the MRU end of salt a.
		cacheBatch("mp-a", 1, 3, "store", "l2", "fs", "a", h(1), 150),
	), 4, 0, 0)
	c.stop()
	if err := c.wait(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no checkpoint after a clean stop: %v", err)
	}
	return path, raw
}

// TestCheckpointRestoresLedgerAndGate: a clean stop writes a checkpoint; a
// coordinator started on it has the same keys, sizes, per-salt usage and
// LRU order (a checkpoint written right after restoring is byte-identical
// to the one restored) and the same gate cursors (a replayed batch is a
// duplicate, the next seq applies).
func TestCheckpointRestoresLedgerAndGate(t *testing.T) {
	path, first := checkpointFixture(t)
	c := startCoord(t, func(cfg *config.Config) { cfg.Ingest.CheckpointPath = path; cfg.Ingest.CheckpointInterval = 0 })
	if got := c.usageBytes("a"); got != 450 {
		t.Errorf("salt a usage after restore = %d, want 450", got)
	}
	if got := c.usageBytes("b"); got != 50 {
		t.Errorf("salt b usage after restore = %d, want 50", got)
	}
	metric(t, c, "lmcache_coordinator_tracked_keys 3")
	metric(t, c, "lmcache_coordinator_checkpoint_restored_keys 3")
	metric(t, c, "lmcache_coordinator_checkpoint_load_failures_total 0")
	if err := c.srv.SaveCheckpoint(); err != nil {
		t.Fatal(err)
	}
	again, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, again) {
		t.Errorf("checkpoint after restore differs from the one restored (%d vs %d bytes)", len(again), len(first))
	}
	h3 := strings.Repeat("0", 62) + "30"
	wantReply(t, c.postEvents(cacheBatch("mp-a", 1, 3, "delete", "l2", "fs", "a", h3, 300)), 0, 1, 0)
	wantReply(t, c.postEvents(cacheBatch("mp-b", 3, 8, "store", "l2", "fs", "b", h3, 1)), 0, 0, 1)
	wantReply(t, c.postEvents(cacheBatch("mp-a", 1, 4, "delete", "l2", "fs", "a", h3, 300)), 1, 0, 0)
	if got := c.usageBytes("a"); got != 150 {
		t.Errorf("salt a usage after the next delete = %d, want 150", got)
	}
}

// TestCheckpointBadArtifactMovedAside: a truncated artifact, one with a bad
// checksum, one of another version and one that is not a checkpoint are
// each moved aside (renamed .corrupt-<time>), logged at ERROR and counted;
// the coordinator starts cold.
func TestCheckpointBadArtifactMovedAside(t *testing.T) {
	_, good := checkpointFixture(t)
	for name, mutate := range map[string]func([]byte) []byte{
		"truncated": func(b []byte) []byte { return b[:len(b)-5] },
		"checksum":  func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b },
		"version":   func(b []byte) []byte { binary.LittleEndian.PutUint32(b[8:], 2); return b },
		"garbage":   func([]byte) []byte { return []byte(`{"not":"a checkpoint"}`) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "coord.ckpt")
			bad := mutate(bytes.Clone(good))
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			c := startCoord(t, func(cfg *config.Config) { cfg.Ingest.CheckpointPath = path; cfg.Ingest.CheckpointInterval = 0 })
			if got := c.usageBytes("a"); got != 0 {
				t.Errorf("usage after a bad checkpoint = %d, want 0 (cold)", got)
			}
			metric(t, c, "lmcache_coordinator_checkpoint_load_failures_total 1")
			metric(t, c, "lmcache_coordinator_tracked_keys 0")
			if !c.logs.Has("level=ERROR msg=\"CHECKPOINT UNUSABLE") {
				t.Errorf("no ERROR line about the bad checkpoint:\n%s", c.logs.String())
			}
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved-aside files %v, want one", aside)
			}
			if kept, err := os.ReadFile(aside[0]); err != nil || !bytes.Equal(kept, bad) {
				t.Errorf("moved-aside file differs from the bad artifact (err %v)", err)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("bad artifact still at %s (err %v)", path, err)
			}
		})
	}
}

// TestKafkaNotReadyHoldsEviction: in kafka mode with the brokers
// unreachable the lag is unknown (-1, never read as caught up), readiness
// stays 0, and the eviction loop is not started (registered, never run) (it waits for the lag to
// be within --max-ready-lag), while the lag loop keeps measuring; POST
// /events is not mounted (404 {"detail":"Not Found"}, absent from
// /openapi.json) and /quota/events still applies.
func TestKafkaNotReadyHoldsEviction(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := startCoord(t, func(cfg *config.Config) {
		cfg.EvictionCheckInterval = 0.2
		cfg.Ingest.EventTransport = config.TransportKafka
		cfg.Ingest.KafkaBootstrapServers = dead
	})
	waitFor(t, "two lag measurements", func() bool {
		_, raw := c.do("GET", "/periodic-threads/coordinator-kafka-lag", nil)
		var st struct {
			TotalRuns int `json:"total_runs"`
		}
		return json.Unmarshal(raw, &st) == nil && st.TotalRuns >= 2
	})
	metric(t, c, "lmcache_coordinator_kafka_lag -1")
	metric(t, c, "lmcache_coordinator_kafka_ready 0")
	_, raw := c.do("GET", "/periodic-threads/coordinator-eviction", nil)
	var loop struct {
		IsRunning bool `json:"is_running"`
		TotalRuns int  `json:"total_runs"`
	}
	if err := json.Unmarshal(raw, &loop); err != nil || loop.IsRunning || loop.TotalRuns != 0 {
		t.Errorf("eviction loop ran before the stream caught up: %s", raw)
	}
	if code, raw := c.do("POST", "/events", map[string]any{"batches": []any{}}); code != 404 || string(raw) != `{"detail":"Not Found"}` {
		t.Errorf("POST /events in kafka mode: %d %s", code, raw)
	}
	if _, raw := c.do("GET", "/openapi.json", nil); strings.Contains(string(raw), `"/events"`) || !strings.Contains(string(raw), `"/quota/events"`) {
		t.Errorf("kafka mode's OpenAPI document must list /quota/events and not /events")
	}
	c.events(ev("store", strings.Repeat("ab", 32), "q", 10))
	if got := c.usageBytes("q"); got != 10 {
		t.Errorf("/quota/events in kafka mode: usage %d, want 10", got)
	}
}
