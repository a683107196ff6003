package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCoordinatorConfigFileAndSources starts `lmcache coordinator` from a
// config file (LMCACHE_MP_COORDINATOR_CONFIG_FILE) with environment
// variables and a flag on top, and reads GET /config over HTTP: each value
// comes from the highest layer that set it (flag > env > file > default),
// "_sources" names that layer for every key, the route needs the token the
// file set, and neither that token nor the env's MP token is in the body.
func TestCoordinatorConfigFileAndSources(t *testing.T) {
	const fileTok, envTok = "coord-file-tok-3e8d", "coord-env-mp-tok-a47b"
	port := freePort(t)
	path := filepath.Join(t.TempDir(), "coordinator.yaml")
	body := "host: 127.0.0.1\nport: " + itoa(port) + "\nchunk_size: 16\neviction_ratio: 0.5\ninstance_timeout: 9\n" +
		"health_check_interval: 0\nauth_token: " + fileTok + "\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append([]string{"LMCACHE_MP_COORDINATOR_CONFIG_FILE=" + path, "LMCACHE_MP_COORDINATOR_CHUNK_SIZE=32",
		"LMCACHE_MP_COORDINATOR_EVICTION_RATIO=0.6", "LMCACHE_MP_COORDINATOR_MP_AUTH_TOKEN=" + envTok}, noResync...)
	p := start(t, "coordinator-config-file", env, "coordinator", "--eviction-ratio", "0.7", "--eviction-check-interval", "0")
	base := "http://127.0.0.1:" + itoa(port)
	waitFor(t, "healthz", healthy(base+"/healthz"))

	if code, _ := call(t, "GET", base+"/config", nil, nil, nil); code != 401 {
		t.Fatalf("GET /config without the file's token = %d, want 401", code)
	}
	auth := map[string]string{"Authorization": "Bearer " + fileTok}
	var raw []byte
	if code, _ := call(t, "GET", base+"/config", nil, auth, &rawJSON{&raw}); code != 200 {
		t.Fatalf("GET /config = %d", code)
	}
	if strings.Contains(string(raw), fileTok) || strings.Contains(string(raw), envTok) {
		t.Fatalf("GET /config carries a token: %s", raw)
	}
	var cfg map[string]map[string]any
	if code, _ := call(t, "GET", base+"/config", nil, auth, &cfg); code != 200 {
		t.Fatalf("GET /config = %d", code)
	}
	values, sources := cfg["coordinator"], cfg["_sources"]["coordinator"].(map[string]any)
	for key, want := range map[string]struct {
		value  any
		source string
	}{
		"eviction_ratio":          {0.7, "flag:--eviction-ratio"},
		"eviction_check_interval": {0.0, "flag:--eviction-check-interval"},
		"chunk_size":              {32.0, "env:LMCACHE_MP_COORDINATOR_CHUNK_SIZE"},
		"enable_startup_resync":   {false, "env:LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC"},
		"port":                    {float64(port), "file:" + path},
		"instance_timeout":        {9.0, "file:" + path},
		"auth_token":              {"***REDACTED***", "file:" + path},
		"mp_auth_token":           {"***REDACTED***", "env:LMCACHE_MP_COORDINATOR_MP_AUTH_TOKEN"},
		"trigger_watermark":       {1.0, "default"},
		"enable_tracing":          {false, "default"},
	} {
		if values[key] != want.value || sources[key] != want.source {
			t.Errorf("%s = %#v from %#v, want %#v from %q", key, values[key], sources[key], want.value, want.source)
		}
	}
	for key := range values {
		if s, _ := sources[key].(string); s == "" || s == "unknown" {
			t.Errorf("_sources.coordinator.%s = %#v", key, sources[key])
		}
	}
	if len(sources) != len(values) || len(cfg) != 2 {
		t.Errorf("%d values, %d sources, %d top-level keys", len(values), len(sources), len(cfg))
	}
	p.Stop(t)
	if out := p.Output(t); strings.Contains(out, fileTok) || strings.Contains(out, envTok) {
		t.Error("the coordinator logged a token")
	}
}
