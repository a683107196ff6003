package coordinator_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestStateFileUnknownVersionOrBadPinMovedAside: a state file of another
// version, or one whose pin key is not a valid key, is moved aside as
// corrupt and the coordinator starts empty.
func TestStateFileUnknownVersionOrBadPinMovedAside(t *testing.T) {
	for name, body := range map[string]string{
		"version": `{"version": 99, "default_limit_bytes": null, "quotas": {"a": 1073741824}, "pins": []}`,
		"pin": `{"version": 1, "default_limit_bytes": null, "quotas": {"a": 1073741824}, "pins": [` +
			`{"key": {"chunk_hash_hex": "not-hex", "model_name": "m", "kv_rank": 0, "cache_salt": "a"}, "count": 1}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.json")
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			c := startCoord(t, func(cfg *config.Config) { cfg.StateFile = path })
			aside, err := filepath.Glob(path + ".corrupt-*")
			if err != nil || len(aside) != 1 {
				t.Fatalf("moved-aside files %v (%v)", aside, err)
			}
			if b, err := os.ReadFile(aside[0]); err != nil || string(b) != body {
				t.Fatalf("moved-aside content %q (%v)", b, err)
			}
			if !c.logs.Has("level=ERROR") || !c.logs.Has("state file is corrupt") || !c.logs.Has(aside[0]) {
				t.Fatalf("no ERROR line naming %s:\n%s", aside[0], c.logs.String())
			}
			if _, raw := c.do("GET", "/healthz", nil); string(raw) != `{"state_file_corrupt":true,"status":"healthy"}` {
				t.Fatalf("healthz = %s", raw)
			}
			if g := c.must("GET", "/quota/a", nil, 200); g["quota_exists"] != false {
				t.Fatalf("quota from the corrupt file loaded: %v", g)
			}
		})
	}
}

// TestL1FactsCapDropsAndCounts: the production bound is 1,000,000 keys;
// lowered to 2, a third new key is dropped and counted, while a known
// key's size still updates and a freed slot is reused.
func TestL1FactsCapDropsAndCounts(t *testing.T) {
	if n := coordinator.MaxL1Facts(); n != 1_000_000 {
		t.Fatalf("maxL1Facts = %d, want 1000000", n)
	}
	defer coordinator.SetMaxL1Facts(2)()
	c := startCoord(t, nil)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-l", "ip": "127.0.0.1", "http_port": 8081}, 200)
	wantReply(t, c.postEvents(cacheBatch("mp-l", 1, 1, "store", "l1", "dram", "t", "a1", 10, "a2", 20, "a3", 40)), 1, 0, 0)
	c.wantL1("mp-l", 30, 2)
	metric(t, c, "lmcache_coordinator_l1_facts_dropped_total 1")
	wantReply(t, c.postEvents(cacheBatch("mp-l", 1, 2, "store", "l1", "dram", "t", "a1", 15)), 1, 0, 0)
	c.wantL1("mp-l", 35, 2)
	wantReply(t, c.postEvents(cacheBatch("mp-l", 1, 3, "delete", "l1", "dram", "t", "a2", 0)), 1, 0, 0)
	wantReply(t, c.postEvents(cacheBatch("mp-l", 1, 4, "store", "l1", "dram", "t", "a3", 40)), 1, 0, 0)
	c.wantL1("mp-l", 55, 2)
	metric(t, c, "lmcache_coordinator_l1_facts_dropped_total 1")
	if _, raw := c.do("GET", "/metrics", nil); !strings.Contains(string(raw), "# TYPE lmcache_coordinator_l1_facts_dropped_total counter") {
		t.Fatal("l1_facts_dropped_total is not a counter")
	}
}
