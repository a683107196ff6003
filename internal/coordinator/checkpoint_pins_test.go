package coordinator_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestCheckpointRestartParksPins: a coordinator restarted from its
// checkpoint and state file restores the pins before the keys, so the two
// pinned keys at salt a's least recent end are parked as they load and the
// first eviction cycle walks only its three victims; it walked the pinned
// keys first (5 entries) when pins were restored after the keys.
func TestCheckpointRestartParksPins(t *testing.T) {
	dir := t.TempDir()
	opts := func(cfg *config.Config) {
		cfg.Ingest.CheckpointPath, cfg.Ingest.CheckpointInterval = filepath.Join(dir, "coord.ckpt"), 0
		cfg.StateFile = filepath.Join(dir, "state.json")
		cfg.EvictionRatio = 0.5
	}
	c := startCoord(t, opts)
	pinned := tokenHashes(t, []int64{1, 2, 3, 4, 5, 6, 7, 8})
	c.events(rev("store", pinned[0], "a", mib), rev("store", pinned[1], "a", mib), rev("store", "03", "a", mib),
		rev("store", "04", "a", mib), rev("store", "05", "a", mib), rev("store", "06", "a", mib))
	if g := c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "cache_salt": "a"}, 200); g["affected"] != 2.0 {
		t.Fatalf("pin = %v", g)
	}
	c.stop()
	if err := c.wait(); err != nil {
		t.Fatal(err)
	}

	c = startCoord(t, opts)
	metric(t, c, "lmcache_coordinator_checkpoint_restored_keys 6")
	newMP(t).register(c, "mp-1")
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 3.0 / 1024}, 200) // 3 MiB; usage 6 MiB
	r := c.srv.RunEvictionCycle(context.Background())
	c.srv.WaitDispatches()
	if r.Victims != 3 || r.Walked != 3 {
		t.Fatalf("first cycle after the restart: %d victims after walking %d entries, want 3 after 3", r.Victims, r.Walked)
	}
}
