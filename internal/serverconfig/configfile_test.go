package serverconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func configFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "server.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigFile: --config-file (or LMCACHE_CONFIG_FILE) supplies values
// keyed by flag name in snake_case below the environment and the flags;
// Sources says which layer set each /config key.
func TestConfigFile(t *testing.T) {
	path := configFile(t, `chunk_size: 512
l1_size_gb: 2
eviction_policy: IsolatedLRU
l1-use-lazy: false
coordinator_url: http://file:9300
http_auth_token: file-secret-token
coordinator_auth_token: file-coord-token
l2_adapter:
  - type: fs
    base_path: /tmp/l2
script_allowed_imports: [math, json]
`)
	e := env(map[string]string{EnvConfigFile: path, "LMCACHE_COORDINATOR_URL": "http://env:9300"})
	c, err := ParseEnv([]string{"--chunk-size", "1024"}, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ChunkSize != 1024 || c.L1SizeGB != 2 || c.EvictionPolicy != "IsolatedLRU" || c.L1UseLazy || c.CoordinatorURL != "http://env:9300" ||
		c.HTTPAuthToken != "file-secret-token" || strings.Join(c.L2Adapters, ";") != `{"base_path":"/tmp/l2","type":"fs"}` ||
		strings.Join(c.ScriptAllowedImports, ",") != "math,json" {
		t.Fatalf("parsed %+v", c)
	}
	src := c.Sources()
	for _, w := range []struct{ group, key, want string }{
		{GroupMP, "chunk_size", "flag:--chunk-size"},
		{GroupStorage, "l1_size_gb", "file:" + path},
		{GroupStorage, "l2_adapter", "file:" + path},
		{GroupCoordinator, "coordinator_url", "env:LMCACHE_COORDINATOR_URL"},
		{GroupHTTP, "http_port", "default"},
	} {
		if got := src[w.group][w.key]; got != w.want {
			t.Errorf("sources[%s][%s] = %q, want %q", w.group, w.key, got, w.want)
		}
	}
	view := c.ConfigView()
	if view[GroupMP]["chunk_size"] != 1024 || len(view) != 6 {
		t.Errorf("view groups %d, chunk_size %v", len(view), view[GroupMP]["chunk_size"])
	}
	if s, ok := view[SourcesKey][GroupStorage].(map[string]string); !ok || s["l1_size_gb"] != "file:"+path {
		t.Errorf("view %s = %#v", SourcesKey, view[SourcesKey][GroupStorage])
	}
	if _, leaked := view[GroupHTTP]["http_auth_token"]; leaked {
		t.Error("the HTTP token must not appear in /config")
	}
	if c.CoordinatorAuthToken != "file-coord-token" || view[GroupCoordinator]["coordinator_auth_token"] != Redacted {
		t.Errorf("coordinator token %q shown as %v", c.CoordinatorAuthToken, view[GroupCoordinator]["coordinator_auth_token"])
	}
}

// TestConfigFileErrors: a bad key or a bad value in the file gives the one
// line naming the flag, the file and the line, and a bad file fails the
// server before anything starts.
func TestConfigFileErrors(t *testing.T) {
	badKey := configFile(t, "chunk_size: 512\nchunk_sise: 1\n")
	badValue := configFile(t, "chunk_size: 512\neviction_ratio: 2\n")
	secret := configFile(t, "http_auth_token: [tok-in-a-list-123]\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config-file", badKey}, `--config-file: ` + badKey + ` line 2: unknown key "chunk_sise"`},
		{[]string{"--config-file", badValue}, `--eviction-ratio: ` + badValue + ` line 2: must satisfy 0 <= x <= 1 (got 2)`},
		{[]string{"--config-file", secret}, `--http-auth-token: ` + secret + ` line 1: takes one value, not a list`},
	} {
		_, err := ParseEnv(c.args, env(nil), nil)
		if !errors.Is(err, ErrInvalid) || err.Error() != c.want {
			t.Errorf("%v:\n got %v\nwant %s", c.args, err, c.want)
		}
	}
}

// TestLogFormatUpstream: --log-format and LMCACHE_LOG_FORMAT accept
// upstream (cmd/lmcache's upstream line handler) next to text and json.
func TestLogFormatUpstream(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--log-format", "upstream"}, nil},
		{nil, map[string]string{"LMCACHE_LOG_FORMAT": "upstream"}},
	} {
		c, err := ParseEnv(tc.args, env(tc.env), nil)
		if err != nil || c.LogFormat != "upstream" {
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		}
	}
	_, err := ParseEnv([]string{"--log-format", "xml"}, env(nil), nil)
	if err == nil || err.Error() != `--log-format: must be one of text, json, upstream (got "xml")` {
		t.Errorf("xml: %v", err)
	}
}

// TestUpstreamTOMLConfig: a TOML file named by upstream's LMCACHE_MP_CONFIG
// (keys as upstream's argparse dests or flag names) configures the server;
// LMCACHE_CONFIG_FILE, when also set, wins.
func TestUpstreamTOMLConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mp.toml")
	if err := os.WriteFile(path, []byte("chunk_size = 512\nmax-workers = 4\nscript_allowed_imports = [\"math\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := ParseEnv(nil, env(map[string]string{EnvUpstreamConfig: path}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ChunkSize != 512 || c.MaxWorkers != 4 || strings.Join(c.ScriptAllowedImports, ",") != "math" || c.Sources()[GroupMP]["max_workers"] != "file:"+path {
		t.Fatalf("chunk %d workers %d imports %q source %q", c.ChunkSize, c.MaxWorkers, c.ScriptAllowedImports, c.Sources()[GroupMP]["max_workers"])
	}
	yml := configFile(t, "chunk_size: 64\n")
	c, err = ParseEnv(nil, env(map[string]string{EnvUpstreamConfig: path, EnvConfigFile: yml}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ChunkSize != 64 || c.MaxWorkers != 1 {
		t.Fatalf("%s over %s: %v chunk %d workers %d", EnvConfigFile, EnvUpstreamConfig, err, c.ChunkSize, c.MaxWorkers)
	}
}
