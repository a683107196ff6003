package coordinator_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// TestPrefetchRelay is research 10.6 "Prefetch" plus the 502 paths.
func TestPrefetchRelay(t *testing.T) {
	c := startCoord(t, nil)
	body := map[string]any{"instance_id": "mp-1", "model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5}, "cache_salt": "a"}
	g := c.must("POST", "/cache/prefetches", body, 404)
	if g["detail"] != "no MP server registered with instance_id='mp-1'" {
		t.Fatalf("404 = %v", g)
	}
	c.must("GET", "/cache/prefetches/mp-1/abc", nil, 404)

	mp := newMP(t)
	mp.register(c, "mp-1")
	if _, raw := c.do("POST", "/cache/prefetches", body); string(raw) != `{"instance_id":"mp-1","request_id":"abc","chunks":2,"status":"submitted"}` {
		t.Fatalf("submit = %s", raw)
	}
	if f := fmt.Sprint(mp.prefetches[0]); f != "map[cache_salt:a model_name:m token_ids:[1 2 3 4 5] world_size:1]" {
		t.Fatalf("forwarded %s", f)
	}
	if code, raw := c.do("GET", "/cache/prefetches/mp-1/abc", nil); code != 200 || string(raw) != `{"status":"completed","found_keys":2,"total_keys":2}` {
		t.Fatalf("status = %d %s", code, raw)
	}
	// The server's codes are relayed verbatim; a non-JSON body is wrapped.
	mp.mu.Lock()
	mp.statusCode, mp.statusBody = 404, `{"detail":"unknown request_id"}`
	mp.mu.Unlock()
	if code, raw := c.do("GET", "/cache/prefetches/mp-1/zzz", nil); code != 404 || string(raw) != `{"detail":"unknown request_id"}` {
		t.Fatalf("relayed 404 = %d %s", code, raw)
	}
	mp.mu.Lock()
	mp.statusCode, mp.statusBody = 503, `not ready`
	mp.mu.Unlock()
	if code, raw := c.do("GET", "/cache/prefetches/mp-1/zzz", nil); code != 503 || string(raw) != `{"detail":"not ready"}` {
		t.Fatalf("relayed 503 = %d %s", code, raw)
	}
	// A sub-chunk prompt: the server's noop reply.
	mp.mu.Lock()
	mp.submitBody = `{"chunks":0,"status":"noop"}`
	mp.mu.Unlock()
	if _, raw := c.do("POST", "/cache/prefetches", body); string(raw) != `{"instance_id":"mp-1","request_id":"","chunks":0,"status":"noop"}` {
		t.Fatalf("noop = %s", raw)
	}
	// A rejected submit is 502.
	mp.mu.Lock()
	mp.submitCode, mp.submitBody = 503, `{"detail":"no layout"}`
	mp.mu.Unlock()
	if g := c.must("POST", "/cache/prefetches", body, 502); !strings.HasPrefix(g["detail"].(string), "prefetch submit to 'mp-1' failed") {
		t.Fatalf("502 = %v", g)
	}
	c.must("POST", "/cache/prefetches", map[string]any{"instance_id": "mp-1", "model_name": "m", "world_size": 0}, 422)
	c.must("POST", "/cache/prefetches", map[string]any{"model_name": "m", "world_size": 1}, 422)
	// An unreachable server is 502 for both.
	mp.Close()
	c.must("POST", "/cache/prefetches", body, 502)
	if g := c.must("GET", "/cache/prefetches/mp-1/abc", nil, 502); !strings.HasPrefix(g["detail"].(string), "prefetch status from 'mp-1' failed") {
		t.Fatalf("status 502 = %v", g)
	}
}

// TestPinsResolveBitExactKeys is research 10.6 "Pins" and 7.4: tokens 1..8
// at chunk size 4 resolve to the published vectors, which the eviction
// plan then protects.
func TestPinsResolveBitExactKeys(t *testing.T) {
	const h0 = "6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368b71123c"
	const h1 = "98efc76eafb06cfe774c31ff151f300b61a614c27982a211bb8cdbd83a8c0e19"
	c := startCoord(t, nil)
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.events(rev("store", h0, "alice", 1000), rev("store", h1, "alice", 1000))
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 0}, 200)
	pin := map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "cache_salt": "alice"}
	if _, raw := c.do("POST", "/cache/pins", pin); string(raw) != `{"requested":2,"affected":2,"status":"pinned"}` {
		t.Fatalf("pin = %s", raw)
	}
	if r := c.srv.RunEvictionCycle(context.Background()); r.Victims != 0 {
		t.Fatalf("pinned keys planned: %+v", r)
	}
	// Reference counted: pin again, unpin once, still protected.
	c.must("POST", "/cache/pins", pin, 200)
	if _, raw := c.do("DELETE", "/cache/pins", pin); string(raw) != `{"requested":2,"affected":2,"status":"unpinned"}` {
		t.Fatalf("unpin = %s", raw)
	}
	if r := c.srv.RunEvictionCycle(context.Background()); r.Victims != 0 {
		t.Fatalf("still-pinned keys planned: %+v", r)
	}
	c.must("DELETE", "/cache/pins", pin, 200)
	c.must("DELETE", "/cache/pins", pin, 200) // unpin below zero is a no-op
	c.cycle()
	if got := strings.Join(hexes(mp.deleteBatches()[0]), ","); got != "alice/"+h0+",alice/"+h1 {
		t.Fatalf("after unpin %s", got)
	}
	// Pins survive delete events and re-stores, and pins may precede stores.
	c.events(rev("delete", h0, "alice", 0), rev("delete", h1, "alice", 0))
	c.must("POST", "/cache/pins", pin, 200)
	c.events(rev("store", h0, "alice", 1000), rev("store", h1, "alice", 1000))
	if r := c.srv.RunEvictionCycle(context.Background()); r.Victims != 0 {
		t.Fatalf("pin before store not honoured: %+v", r)
	}
	_, raw := c.do("GET", "/metrics", nil)
	if !strings.Contains(string(raw), "lmcache_coordinator_active_pins 2") {
		t.Fatalf("active pins metric:\n%s", raw)
	}
}

func TestPinsFanOutAndValidation(t *testing.T) {
	c := startCoord(t, nil)
	w2 := map[string]any{"model_name": "m", "world_size": 2, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8, 9}, "cache_salt": "alice"}
	if _, raw := c.do("POST", "/cache/pins", w2); string(raw) != `{"requested":2,"affected":4,"status":"pinned"}` {
		t.Fatalf("world 2 = %s", raw)
	}
	if _, raw := c.do("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2}}); string(raw) != `{"requested":0,"affected":0,"status":"pinned"}` {
		t.Fatalf("sub-chunk = %s", raw)
	}
	if _, raw := c.do("DELETE", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1}); string(raw) != `{"requested":0,"affected":0,"status":"unpinned"}` {
		t.Fatalf("no tokens = %s", raw)
	}
	// '@' in the model only fails once keys exist (upstream).
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m@x", "world_size": 1, "token_ids": []int{1, 2}}, 200)
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m@x", "world_size": 1, "token_ids": []int{1, 2, 3, 4}}, 400)
	// A bad salt is 400 even for a sub-chunk prompt.
	for _, salt := range []string{"bad@salt", "a/b", strings.Repeat("s", 129)} {
		c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2}, "cache_salt": salt}, 400)
	}
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "cache_salt": "bad@salt"}, 400)
	// Token ids outside uint32 in a full chunk: 400 (upstream 500); in the
	// ignored tail they are never checked.
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int64{1, 2, 3, 1 << 32}}, 400)
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int64{1, 2, 3, 4, -1}}, 200)
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 0, "token_ids": []int{}}, 422)
	c.must("DELETE", "/cache/pins", map[string]any{"model_name": "m", "world_size": 0, "token_ids": []int{}}, 422)
	c.must("DELETE", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1}, "cache_salt": "bad@salt"}, 400)
	c.must("DELETE", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": make([]int, 1_000_001)}, 400)
	c.must("POST", "/cache/pins", map[string]any{"world_size": 1}, 422)
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []any{1, "x"}}, 422)
	// chunks × world_size is bounded (no overflow for absurd world sizes).
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": int64(1) << 62, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}}, 400)
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 3_000_000, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}}, 400)
	// The same values as lax strings (the generic validator) answer the same.
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": "3000000000", "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}}, 400)
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": "0", "token_ids": []int{}}, 422)
	// The 1,000,000-token cap.
	big := make([]int, 1_000_001)
	g := c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": big}, 400)
	if g["detail"] != "too many token_ids in a single request (limit=1000000, got=1000001)" {
		t.Fatalf("cap detail %v", g)
	}
	if _, raw := c.do("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": big[:1_000_000]}); string(raw) != `{"requested":250000,"affected":250000,"status":"pinned"}` {
		t.Fatalf("at the cap = %s", raw)
	}
}

// TestPinsUseConfiguredHashRoot: with --hash-root-hex, pins resolve to the
// keys MP servers started with the same root write, and no longer protect
// keys hashed from the default root.
func TestPinsUseConfiguredHashRoot(t *testing.T) {
	root := strings.Repeat("ab", 32)
	rb, _ := hex.DecodeString(root)
	h, err := tokenhash.New(tokenhash.Blake3, 4, tokenhash.WithRoot(rb))
	if err != nil {
		t.Fatal(err)
	}
	hashes, err := h.ChunkHashes([]int64{1, 2, 3, 4, 5, 6, 7, 8})
	if err != nil {
		t.Fatal(err)
	}
	r0, r1 := hex.EncodeToString(hashes[0]), hex.EncodeToString(hashes[1])
	const d0 = "6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368b71123c" // default root
	c := startCoord(t, func(cfg *config.Config) { cfg.HashRootHex = root })
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.events(rev("store", r0, "alice", 1000), rev("store", r1, "alice", 1000), rev("store", d0, "alice", 1000))
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 0}, 200)
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "cache_salt": "alice"}, 200)
	c.cycle()
	if got := strings.Join(hexes(mp.deleteBatches()[0]), ","); got != "alice/"+d0 {
		t.Fatalf("victims %s, want only the default-root key", got)
	}
}
