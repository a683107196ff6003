package coordinator_test

import (
	"fmt"
	"testing"

	"github.com/lmcache-go/lmcache/internal/etcdtest"
)

// TestHAMirrorForgetsDeletedIntent: quotas deleted and sequences unpinned
// leave nothing in the intent mirror of either coordinator once the watch
// has passed them. Before, the mirror kept the revision of every quota and
// pinned sequence ever deleted, so pinning and unpinning per-session
// prompts grew every coordinator's memory without bound.
func TestHAMirrorForgetsDeletedIntent(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	a := startHA(t, cl.Endpoints, nil)
	waitFor(t, "A ready", func() bool { code, _ := a.readyz(); return code == 200 })
	b := startHA(t, cl.Endpoints, nil)
	waitFor(t, "B sees A lead", func() bool { code, r := b.readyz(); return code == 503 && r["leader"] == a.base })
	const n = 20
	for i := range n {
		salt := fmt.Sprintf("s-%d", i)
		a.must("PUT", "/quota/"+salt, map[string]any{"limit_gb": 1}, 200)
		pin := map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{i, 2, 3, 4}, "cache_salt": salt}
		a.must("POST", "/cache/pins", pin, 200)
		a.must("DELETE", "/cache/pins", pin, 200)
		a.must("DELETE", "/quota/"+salt, nil, 200)
	}
	// One name that stays, written last: once B has it, B's watch has
	// delivered every change before it.
	a.must("PUT", "/quota/kept", map[string]any{"limit_gb": 1}, 200)
	waitFor(t, "B mirrors the last quota", func() bool {
		return b.must("GET", "/quota/kept", nil, 200)["quota_exists"] == true
	})
	if got := b.srv.IntentMirrorNames(); got != 1 {
		t.Fatalf("standby mirror holds %d names, want 1 (quota/kept)", got)
	}
	// The leader applied its own writes at once; its watch delivers them
	// later, and then the deletions are forgotten there too.
	waitFor(t, "the leader's mirror to forget the deletions", func() bool { return a.srv.IntentMirrorNames() == 1 })
	if got := a.metric("lmcache_coordinator_active_pins"); got != 0 {
		t.Fatalf("leader active pins %v, want 0", got)
	}
	if q := a.must("GET", "/quota/s-0", nil, 200); q["quota_exists"] != false {
		t.Fatalf("deleted quota still exists on the leader: %v", q)
	}
}
