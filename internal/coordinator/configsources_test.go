package coordinator_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/redact"
)

// TestConfigRouteSources: GET /config serves the running configuration the
// flag layer resolved (a flag over an env var over the config file over the
// default) with "_sources" naming each value's layer; it is a token route,
// and neither the coordinator's own token (set in the file) nor the MP
// token (set by env) appears in the body.
func TestConfigRouteSources(t *testing.T) {
	const fileTok, envTok = "file-coord-tok-5b1e", "env-mp-tok-0c9a"
	path := filepath.Join(t.TempDir(), "coordinator.yaml")
	body := "host: 127.0.0.1\nport: 0\nhealth_check_interval: 0\neviction_check_interval: 0\nenable_startup_resync: false\n" +
		"chunk_size: 16\neviction_ratio: 0.5\ninstance_timeout: 9\nauth_token: " + fileTok + "\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{config.EnvConfigFile: path, config.EnvPrefix + "CHUNK_SIZE": "32",
		config.EnvPrefix + "EVICTION_RATIO": "0.6", config.EnvPrefix + "MP_AUTH_TOKEN": envTok}
	loaded, _, err := config.LoadSources([]string{"--eviction-ratio", "0.7"}, func(k string) (string, bool) { v, ok := vars[k]; return v, ok }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	c := startCoord(t, func(cfg *config.Config) { *cfg = loaded })

	if code, _, raw := c.doAuth("GET", "/config", nil, ""); code != 401 || string(raw) != `{"detail":"missing or invalid bearer token"}` {
		t.Fatalf("GET /config without the token: %d %s", code, raw)
	}
	code, _, raw := c.doAuth("GET", "/config", nil, "Bearer "+fileTok)
	if code != 200 {
		t.Fatalf("GET /config: %d %s", code, raw)
	}
	if strings.Contains(string(raw), fileTok) || strings.Contains(string(raw), envTok) {
		t.Fatalf("GET /config carries a token: %s", raw)
	}
	var got map[string]map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	values, sources := got["coordinator"], got["_sources"]["coordinator"].(map[string]any)
	for key, want := range map[string]struct {
		value  any
		source string
	}{
		"eviction_ratio":    {0.7, "flag:--eviction-ratio"},
		"chunk_size":        {32.0, "env:LMCACHE_MP_COORDINATOR_CHUNK_SIZE"},
		"instance_timeout":  {9.0, "file:" + path},
		"trigger_watermark": {1.0, "default"},
		"auth_token":        {redact.Marker, "file:" + path},
		"mp_auth_token":     {redact.Marker, "env:LMCACHE_MP_COORDINATOR_MP_AUTH_TOKEN"},
		"state_file":        {"", "default"},
		"enable_tracing":    {false, "default"},
	} {
		if values[key] != want.value || sources[key] != want.source {
			t.Errorf("%s = %#v from %#v, want %#v from %q", key, values[key], sources[key], want.value, want.source)
		}
	}
	if len(values) != len(sources) || len(got) != 2 {
		t.Errorf("%d values, %d sources, %d groups: %s", len(values), len(sources), len(got), raw)
	}
	if strings.Contains(c.logs.String(), fileTok) || strings.Contains(c.logs.String(), envTok) {
		t.Error("a log line carries a token")
	}
}
