package coordinator_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestConcurrentIngestEvictionPinsAndReads runs reporters, pin clients,
// readers and the eviction loop at once (meant for -race), then checks that
// the accounting is self-consistent: the total equals the sum of the salts
// and the tracked_bytes metric.
func TestConcurrentIngestEvictionPinsAndReads(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.EvictionCheckInterval = 0.005; cfg.InflightTTL = 0.5 })
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 0.5 / 1024}, 200)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for b := 0; b < 40; b++ {
				evs := make([]any, 0, 50)
				for i := 0; i < 50; i++ {
					typ := []string{"store", "store", "lookup", "delete"}[r.IntN(4)]
					evs = append(evs, rev(typ, fmt.Sprintf("%04x", r.IntN(300)), "s"+strconv.Itoa(r.IntN(5)), 1000+r.IntN(100000)))
				}
				code, raw := c.do("POST", "/quota/events", map[string]any{"instance_id": fmt.Sprint("r", w), "seq": b + 1, "events": evs})
				if code != 200 {
					t.Errorf("ingest %d %s", code, raw)
					return
				}
			}
		}(w)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < 60; i++ {
			method := "POST"
			if i%2 == 1 {
				method = "DELETE"
			}
			body := map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{i, 2, 3, 4, 5, 6, 7, 8}, "cache_salt": "s1"}
			if code, raw := c.do(method, "/cache/pins", body); code != 200 {
				t.Errorf("pins %d %s", code, raw)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 60; i++ {
			for _, p := range []string{"/quota", "/metrics", "/instances", "/quota/s1"} {
				if code, _ := c.do("GET", p, nil); code != 200 {
					t.Errorf("GET %s = %d", p, code)
					return
				}
			}
		}
	}()
	wg.Wait()
	g := c.must("GET", "/quota", nil, 200)
	sum := 0.0
	for _, row := range g["by_cache_salt"].([]any) {
		sum += row.(map[string]any)["usage_gb"].(float64)
	}
	total := g["total_gb"].(float64)
	if math.Abs(sum-total) > 1e-12 {
		t.Fatalf("total %v != sum of salts %v", total, sum)
	}
	_, raw := c.do("GET", "/metrics", nil)
	var tracked float64 = -1
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "lmcache_coordinator_tracked_bytes "); ok {
			tracked, _ = strconv.ParseFloat(v, 64)
		}
	}
	if want := math.Round(total * (1 << 30)); tracked != want {
		t.Fatalf("tracked_bytes metric %v, /quota total %v bytes", tracked, want)
	}
	if len(mp.deleteBatches()) == 0 {
		t.Fatal("the eviction loop never dispatched")
	}
}
