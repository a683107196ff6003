package coordinator_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

const mib = 1 << 20

// rank1 is kv_rank for world size 1, rank 0: (1<<24)|(0<<16)|(1<<8)|0.
const rank1 = 16777472

func rkey(hash, salt string) map[string]any {
	return map[string]any{"chunk_hash_hex": hash, "model_name": "m", "kv_rank": rank1, "object_group_id": 0, "cache_salt": salt}
}

func rev(typ, hash, salt string, n int) map[string]any {
	return map[string]any{"type": typ, "key": rkey(hash, salt), "bytes": n}
}

func (c *coord) cycle() {
	c.t.Helper()
	c.srv.RunEvictionCycle(context.Background())
	c.srv.WaitDispatches()
}

func hexes(keys []objkey.Encoded) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.CacheSalt + "/" + k.ChunkHashHex
	}
	return out
}

func tokenHashes(t *testing.T, tokens []int64) []string {
	t.Helper()
	h, err := tokenhash.New("blake3", 4)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := h.ChunkHashes(tokens)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(hs))
	for i, b := range hs {
		out[i] = hex.EncodeToString(b)
	}
	return out
}

// TestEvictionSendsExactLRUVictims: a salt over quota gets exactly its LRU
// victims (ratio by key count), a lookup refreshes recency, pinned keys are
// skipped, a salt under quota is untouched, and usage only moves when the
// delete events come back.
func TestEvictionSendsExactLRUVictims(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.EvictionRatio = 0.5 })
	mp := newMP(t)
	mp.register(c, "mp-1")

	k1 := tokenHashes(t, []int64{1, 2, 3, 4})[0] // pinned below
	c.events(rev("store", k1, "a", mib), rev("store", "02", "a", mib), rev("store", "03", "a", mib),
		rev("store", "04", "a", mib), rev("store", "05", "a", mib), rev("store", "06", "a", mib),
		rev("store", "b1", "b", mib), rev("store", "b2", "b", mib))
	c.events(rev("lookup", "02", "a", 0))   // order: k1 03 04 05 06 02
	c.events(rev("lookup", "ffff", "a", 0)) // unknown: never inserted
	if g := c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5}, "cache_salt": "a"}, 200); g["affected"] != 1.0 {
		t.Fatalf("pin = %v", g)
	}
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 3.0 / 1024}, 200) // 3 MiB; usage 6 MiB
	c.must("PUT", "/quota/b", map[string]any{"limit_gb": 1.0}, 200)        // under quota

	c.cycle()
	batches := mp.deleteBatches()
	if len(batches) != 1 {
		t.Fatalf("want 1 DELETE, got %d", len(batches))
	}
	// floor(6 × 0.5) = 3 victims, LRU first, skipping the pinned key.
	if got := strings.Join(hexes(batches[0]), ","); got != "a/03,a/04,a/05" {
		t.Fatalf("victims %s", got)
	}
	wantBody := `{"keys":[{"chunk_hash_hex":"03","model_name":"m","kv_rank":16777472,"object_group_id":0,"cache_salt":"a"},`
	if !strings.HasPrefix(mp.rawDeletes[0], wantBody) {
		t.Fatalf("wire body %s", mp.rawDeletes[0])
	}
	if u := c.usageBytes("a"); u != 6*mib {
		t.Fatalf("usage changed before delete events: %d", u)
	}
	// Still in flight: the next cycle does not re-send them, and walks only
	// them: the first parked the pinned key.
	if r := c.srv.RunEvictionCycle(context.Background()); r.Victims != 0 || r.InFlight != 3 || r.Walked != 3 {
		t.Fatalf("second cycle %+v", r)
	}
	c.srv.WaitDispatches()
	if n := len(mp.deleteBatches()); n != 1 {
		t.Fatalf("in-flight victims re-sent: %d requests", n)
	}
	// The server's delete events arrive: usage drops to 3 MiB = limit, which
	// still triggers (usage >= watermark × limit): floor(3 × 0.5) = 1.
	c.events(rev("delete", "03", "a", 0), rev("delete", "04", "a", 0), rev("delete", "05", "a", 0))
	if u := c.usageBytes("a"); u != 3*mib {
		t.Fatalf("usage after deletes %d", u)
	}
	c.cycle()
	batches = mp.deleteBatches()
	if got := strings.Join(hexes(batches[1]), ","); got != "a/06" {
		t.Fatalf("second victims %s", got)
	}
	// Unpinning makes the pinned key evictable again.
	c.events(rev("delete", "06", "a", 0))
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 0}, 200)
	c.must("DELETE", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}, "cache_salt": "a"}, 200)
	c.cycle()
	batches = mp.deleteBatches()
	if got := strings.Join(hexes(batches[2]), ","); got != "a/"+k1+",a/02" {
		t.Fatalf("after unpin %s", got)
	}
	for _, b := range batches {
		for _, k := range b {
			if k.CacheSalt == "b" {
				t.Fatalf("salt under quota evicted: %v", k)
			}
		}
	}
}

// TestEvictionDefaultLimit: null exempts, 0 arms the allowlist (every
// unquota'd byte), a positive value is each unquota'd salt's budget; an
// explicit quota applies even while the default is null.
func TestEvictionDefaultLimit(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.EvictionRatio = 0.5; cfg.InflightTTL = 0 })
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.events(rev("store", "01", "x", mib), rev("store", "02", "y", mib), rev("store", "03", "y", mib))

	c.cycle()
	if n := len(mp.deleteBatches()); n != 0 {
		t.Fatalf("null default evicted: %d requests", n)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 0}, 200)
	c.cycle()
	if got := strings.Join(hexes(mp.deleteBatches()[0]), ","); got != "x/01,y/02,y/03" {
		t.Fatalf("default 0 victims %s", got)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 1.5 / 1024}, 200) // 1.5 MiB
	c.cycle()
	if got := strings.Join(hexes(mp.deleteBatches()[1]), ","); got != "y/02" {
		t.Fatalf("default 1.5MiB victims %s", got)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": nil}, 200)
	c.must("PUT", "/quota/x", map[string]any{"limit_gb": 0.5 / 1024}, 200)
	c.cycle()
	if got := strings.Join(hexes(mp.deleteBatches()[2]), ","); got != "x/01" {
		t.Fatalf("explicit quota under null default: %s", got)
	}
	// Without the in-flight set (TTL 0) upstream's re-send behaviour holds.
	c.cycle()
	if got := strings.Join(hexes(mp.deleteBatches()[3]), ","); got != "x/01" {
		t.Fatalf("re-send with TTL 0: %s", got)
	}
	// Removing the explicit quota falls back to the null default: exempt.
	c.must("DELETE", "/quota/x", nil, 200)
	c.cycle()
	if n := len(mp.deleteBatches()); n != 4 {
		t.Fatalf("deleted quota under null default evicted: %d requests", n)
	}
}

func TestEvictionWatermark(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.TriggerWatermark = 0.8; cfg.EvictionRatio = 1 })
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.must("PUT", "/quota/w", map[string]any{"limit_gb": 1.0 / 1024}, 200) // 1 MiB
	c.events(rev("store", "01", "w", 700*1024))
	c.cycle()
	if n := len(mp.deleteBatches()); n != 0 {
		t.Fatalf("700 KiB < 0.8 MiB evicted")
	}
	c.events(rev("store", "01", "w", 900*1024))
	c.cycle()
	if n := len(mp.deleteBatches()); n != 1 {
		t.Fatalf("900 KiB >= 0.8 MiB not evicted")
	}
}

// TestEvictionBatchesOf10000: 25,000 victims go out as 10,000 + 10,000 +
// 5,000 to the same server.
func TestEvictionBatchesOf10000(t *testing.T) {
	c := startCoord(t, nil)
	mp := newMP(t)
	mp.register(c, "mp-1")
	evs := make([]map[string]any, 0, 25000)
	for i := 0; i < 25000; i++ {
		evs = append(evs, rev("store", fmt.Sprintf("%08x", i), "big", 1))
	}
	c.events(evs...)
	c.must("PUT", "/quota/big", map[string]any{"limit_gb": 0}, 200)
	c.cycle()
	var sizes []int
	seen := map[string]bool{}
	for _, b := range mp.deleteBatches() {
		sizes = append(sizes, len(b))
		for _, k := range b {
			seen[k.ChunkHashHex] = true
		}
	}
	sort.Ints(sizes)
	if fmt.Sprint(sizes) != "[5000 10000 10000]" || len(seen) != 25000 {
		t.Fatalf("batch sizes %v, distinct keys %d", sizes, len(seen))
	}
}

// TestEvictionFailuresRetryNextCycle: an empty fleet sends nothing and the
// plan recurs; a 500 from the server is not retried within the cycle but
// the same victims go out again next cycle.
func TestEvictionFailuresRetryNextCycle(t *testing.T) {
	c := startCoord(t, nil)
	c.events(rev("store", "01", "s", 10), rev("store", "02", "s", 10))
	c.must("PUT", "/quota/s", map[string]any{"limit_gb": 0}, 200)
	if r := c.srv.RunEvictionCycle(context.Background()); r.Victims != 2 || r.Target != "" || r.Requests != 0 {
		t.Fatalf("empty fleet cycle %+v", r)
	}
	mp := newMP(t)
	mp.deleteCode = 500
	mp.register(c, "mp-1")
	c.cycle()
	c.cycle()
	b := mp.deleteBatches()
	if len(b) != 2 || strings.Join(hexes(b[0]), ",") != "s/01,s/02" || strings.Join(hexes(b[1]), ",") != "s/01,s/02" {
		t.Fatalf("retries %v", b)
	}
	if u := c.usageBytes("s"); u != 20 {
		t.Fatalf("usage changed on failure: %d", u)
	}
	_, raw := c.do("GET", "/metrics", nil)
	if !strings.Contains(string(raw), "lmcache_coordinator_eviction_dispatch_failures_total 2") {
		t.Fatalf("failure metric missing:\n%s", raw)
	}
	// An unreachable server is a failure too, and falls through.
	mp.Close()
	c.cycle()
	_, raw = c.do("GET", "/metrics", nil)
	if !strings.Contains(string(raw), "lmcache_coordinator_eviction_dispatch_failures_total 3") {
		t.Fatalf("unreachable not counted:\n%s", raw)
	}
}

// TestEvictionLoopDispatchesToRandomServers: the loop runs on its interval
// and spreads cycles over the registered servers.
func TestEvictionLoopDispatchesToRandomServers(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.EvictionCheckInterval = 0.01; cfg.InflightTTL = 0 })
	mp1, mp2 := newMP(t), newMP(t)
	mp1.register(c, "mp-1")
	mp2.register(c, "mp-2")
	c.events(rev("store", "01", "s", 10))
	c.must("PUT", "/quota/s", map[string]any{"limit_gb": 0}, 200)
	waitFor(t, "both servers to receive deletes", func() bool {
		// The fakes never send the delete event back, so after 3
		// dispatches the key would be dropped as a phantom; storing it
		// again restarts its count, so cycles keep choosing a server
		// until both were chosen.
		c.events(rev("store", "01", "s", 10))
		return len(mp1.deleteBatches()) > 0 && len(mp2.deleteBatches()) > 0
	})
}

// TestEvictionNotOKIsAFailure: a 200 DELETE reply with "ok": false is a
// failed dispatch, not a dispatched one: counted in
// eviction_dispatch_failures_total and eviction_dispatch_not_ok_total,
// nothing added to eviction_keys_dispatched_total, and the same victims go
// out again next cycle (their in-flight marks are released).
func TestEvictionNotOKIsAFailure(t *testing.T) {
	c := startCoord(t, nil)
	c.events(rev("store", "01", "s", 10), rev("store", "02", "s", 10))
	c.must("PUT", "/quota/s", map[string]any{"limit_gb": 0}, 200)
	mp := newMP(t)
	mp.deleteReply = `{"requested":2,"adapter":"fs","ok":false,"error":"adapter failed","deleted":0,"skipped":0}`
	mp.register(c, "mp-1")
	c.cycle()
	c.cycle()
	b := mp.deleteBatches()
	if len(b) != 2 || strings.Join(hexes(b[1]), ",") != "s/01,s/02" {
		t.Fatalf("victims not re-sent after ok=false: %v", b)
	}
	_, raw := c.do("GET", "/metrics", nil)
	for _, want := range []string{
		"lmcache_coordinator_eviction_dispatch_failures_total 2\n",
		"lmcache_coordinator_eviction_dispatch_not_ok_total 2\n",
		"lmcache_coordinator_eviction_keys_dispatched_total 0\n",
	} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !c.logs.Has("server answered ok=false") {
		t.Fatalf("no log line for ok=false:\n%s", c.logs.String())
	}
}
