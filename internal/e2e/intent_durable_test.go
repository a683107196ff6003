package e2e

import (
	"net/http"
	"path/filepath"
	"testing"
)

// TestIntentSurvivesKill9: a quota PUT answered 200 is on disk before the
// reply (the state file is written and fsync'd first): the coordinator is
// killed with SIGKILL right after the 200, and the restarted process (same
// --state-file) reports the quota, the default limit and the pin. The pin
// (3 chunks at world size 2: 6 keys) was posted twice, so its keys have pin
// count 2: after the restart one unpin leaves all 6 pinned and the second
// frees them, so the counts survived, not only the keys.
func TestIntentSurvivesKill9(t *testing.T) {
	state := filepath.Join(t.TempDir(), "coordinator-state.json")
	port := freePort(t)
	url := "http://127.0.0.1:" + itoa(port)
	args := []string{"coordinator", "--host", "127.0.0.1", "--port", itoa(port), "--chunk-size", itoa(chunkSize),
		"--eviction-check-interval", "0", "--state-file", state}
	env := []string{"LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=false"}
	first := startKillable(t, "coordinator-1", env, args...)
	waitFor(t, "coordinator-1 healthz", healthy(url+"/healthz"))
	if code, _ := call(t, "PUT", url+"/quota/"+salt, map[string]any{"limit_gb": 1.5}, nil, nil); code != http.StatusOK {
		t.Fatalf("PUT /quota/%s: %d", salt, code)
	}
	if code, _ := call(t, "PUT", url+"/quota/config", map[string]any{"default_limit_gb": 0.25}, nil, nil); code != http.StatusOK {
		t.Fatalf("PUT /quota/config: %d", code)
	}
	pin := map[string]any{"model_name": model, "world_size": 2, "token_ids": pinTokens(3 * chunkSize), "cache_salt": salt}
	for range 2 {
		var r map[string]any
		if code, _ := call(t, "POST", url+"/cache/pins", pin, nil, &r); code != http.StatusOK || r["requested"] != 3.0 || r["affected"] != 6.0 || r["status"] != "pinned" {
			t.Fatalf("POST /cache/pins: %d %v, want 3 chunks, 6 keys pinned", code, r)
		}
	}
	if v := metricValue(metricsText(t, url), "lmcache_coordinator_active_pins"); v != "6" {
		t.Fatalf("active_pins before the kill = %q, want 6", v)
	}
	first.kill()

	second := start(t, "coordinator-2", env, args...)
	defer second.Stop(t)
	waitFor(t, "coordinator-2 healthz", healthy(url+"/healthz"))
	var q quotaView
	if code, _ := call(t, "GET", url+"/quota/"+salt, nil, nil, &q); code != http.StatusOK || q.QuotaLimitGB != 1.5 {
		t.Fatalf("quota after kill -9 and restart: %d %+v, want limit 1.5", code, q)
	}
	var d struct {
		DefaultLimitGB *float64 `json:"default_limit_gb"`
	}
	if code, _ := call(t, "GET", url+"/quota/config", nil, nil, &d); code != http.StatusOK || d.DefaultLimitGB == nil || *d.DefaultLimitGB != 0.25 {
		t.Fatalf("default limit after kill -9 and restart: %d %v, want 0.25", code, d.DefaultLimitGB)
	}
	for i, want := range []string{"6", "6", "0"} {
		if i > 0 {
			var r map[string]any
			if code, _ := call(t, "DELETE", url+"/cache/pins", pin, nil, &r); code != http.StatusOK || r["affected"] != 6.0 || r["status"] != "unpinned" {
				t.Fatalf("DELETE /cache/pins: %d %v", code, r)
			}
		}
		if v := metricValue(metricsText(t, url), "lmcache_coordinator_active_pins"); v != want {
			t.Fatalf("active_pins after kill -9, restart and %d unpins = %q, want %s", i, v, want)
		}
	}
}

// pinTokens is n token ids (1000, 1001, ...).
func pinTokens(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(1000 + i)
	}
	return out
}
