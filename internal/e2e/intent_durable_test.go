package e2e

import (
	"net/http"
	"path/filepath"
	"testing"
)

// TestIntentSurvivesKill9: a quota PUT answered 200 is on disk before the
// reply (the state file is written and fsync'd first): the coordinator is
// killed with SIGKILL right after the 200, and the restarted process (same
// --state-file) reports the quota, the default limit and the pin.
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
}
