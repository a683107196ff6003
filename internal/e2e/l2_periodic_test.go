package e2e

import (
	"net/http"
	"slices"
	"testing"
)

// TestL2EngineLoopsListed: a default server (no coordinator, one fs
// adapter) lists the storage engine's loops in GET /periodic-threads with
// their levels (L1 eviction, write-behind store workers, prefetch workers),
// they run, and /periodic-threads-health is healthy.
func TestL2EngineLoopsListed(t *testing.T) {
	httpPort := freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	start(t, "server-loops", nil, "server", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)),
		"--l1-size-gb", "0.0625", "--l2-adapter", `{"type":"fs","base_path":"`+t.TempDir()+`"}`)
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))
	type thread struct {
		Name      string `json:"name"`
		Level     string `json:"level"`
		IsRunning bool   `json:"is_running"`
		TotalRuns int64  `json:"total_runs"`
	}
	var got struct {
		Threads []thread `json:"threads"`
	}
	want := map[string]string{
		"lmcache-engine-l1-eviction": "high",
		"lmcache-engine-store-0-0":   "high", "lmcache-engine-store-0-1": "high",
		"lmcache-engine-prefetch-0": "medium", "lmcache-engine-prefetch-7": "medium",
	}
	waitFor(t, "the L1 eviction loop to run", func() bool {
		if code, _ := call(t, "GET", base+"/periodic-threads", nil, nil, &got); code != http.StatusOK {
			t.Fatalf("/periodic-threads: %d", code)
		}
		i := slices.IndexFunc(got.Threads, func(th thread) bool { return th.Name == "lmcache-engine-l1-eviction" })
		return i >= 0 && got.Threads[i].TotalRuns > 0
	})
	for name, level := range want {
		i := slices.IndexFunc(got.Threads, func(th thread) bool { return th.Name == name })
		if i < 0 || got.Threads[i].Level != level || !got.Threads[i].IsRunning {
			t.Errorf("loop %s (level %s) missing or not running in %+v", name, level, got.Threads)
		}
	}
	var health struct {
		Healthy bool `json:"healthy"`
	}
	if code, _ := call(t, "GET", base+"/periodic-threads-health", nil, nil, &health); code != http.StatusOK || !health.Healthy {
		t.Fatalf("/periodic-threads-health: %d %+v", code, health)
	}
}
