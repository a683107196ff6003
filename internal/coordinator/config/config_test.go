package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	c, err := Load(nil, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	for key, src := range c.Sources {
		if src != "default" {
			t.Errorf("source of %s = %q with no flag, env or file", key, src)
		}
	}
	if len(c.Sources) != len(fieldsTable()) {
		t.Errorf("%d sources for %d settings", len(c.Sources), len(fieldsTable()))
	}
	c.Sources = nil
	d := Default()
	if !reflect.DeepEqual(c, d) {
		t.Fatalf("got %+v", c)
	}
	if c.Addr() != "0.0.0.0:9300" || c.InstanceTimeout != 30 || c.HealthCheckInterval != 10 || c.EvictionCheckInterval != 5 ||
		c.EvictionRatio != 0.2 || c.TriggerWatermark != 1 || c.ChunkSize != 256 || c.HashAlgorithm != "blake3" ||
		c.BlendProbeStride != 1 || c.TimeoutKeepAlive != 10 || !c.EnableStartupResync || c.ResyncPollInterval != 1 ||
		c.ResyncMaxWait != 60 || c.ResyncPageSize != 1000 || c.StateFile != "" {
		t.Fatalf("defaults %+v", c)
	}
	// The documented defaults as literals (the DeepEqual above only says
	// Load agrees with Default()).
	if c.TimeoutKeepAlive != 10 || c.MetricsTopSalts != 20 || c.InflightTTL != 30 || c.LogLevel != "info" || c.LogFormat != "text" {
		t.Errorf("timeout-keep-alive %d, metrics-top-salts %d, inflight-ttl %v, log-level %q, log-format %q; want 10, 20, 30, info, text",
			c.TimeoutKeepAlive, c.MetricsTopSalts, c.InflightTTL, c.LogLevel, c.LogFormat)
	}
	if c.AuthToken != "" || c.MPAuthToken != "" || c.StateFile != "" || c.BlendProbeStride != 1 {
		t.Errorf("auth-token %q, mp-auth-token %q, state-file %q, blend-probe-stride %d; want \"\", \"\", \"\", 1",
			c.AuthToken, c.MPAuthToken, c.StateFile, c.BlendProbeStride)
	}
}

// TestPrecedence: defaults < env < flags, for every flag and env var.
func TestPrecedence(t *testing.T) {
	e := map[string]string{
		EnvPrefix + "HOST": "10.0.0.1", EnvPrefix + "PORT": "1234", EnvPrefix + "INSTANCE_TIMEOUT": "7.5",
		EnvPrefix + "HEALTH_CHECK_INTERVAL": "0", EnvPrefix + "EVICTION_CHECK_INTERVAL": "0",
		EnvPrefix + "EVICTION_RATIO": "0.5", EnvPrefix + "TRIGGER_WATERMARK": "0.9", EnvPrefix + "CHUNK_SIZE": "16",
		EnvPrefix + "HASH_ALGORITHM": "sha256_cbor", EnvPrefix + "BLEND_PROBE_STRIDE": "3", EnvPrefix + "TIMEOUT_KEEP_ALIVE": "20",
		EnvPrefix + "ENABLE_STARTUP_RESYNC": "False", EnvPrefix + "RESYNC_POLL_INTERVAL": "0.5",
		EnvPrefix + "RESYNC_MAX_WAIT": "0", EnvPrefix + "RESYNC_PAGE_SIZE": "200", EnvPrefix + "STATE_FILE": "/tmp/s.json",
		EnvPrefix + "METRICS_TOP_SALTS": "5", EnvPrefix + "INFLIGHT_TTL": "2.5", EnvPrefix + "LOG_LEVEL": "warn",
		"LMCACHE_LOG_FORMAT": "JSON",
	}
	c, err := Load(nil, env(e), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Host: "10.0.0.1", Port: 1234, InstanceTimeout: 7.5, HealthCheckInterval: 0, EvictionCheckInterval: 0,
		EvictionRatio: 0.5, TriggerWatermark: 0.9, ChunkSize: 16, HashAlgorithm: "sha256_cbor", BlendProbeStride: 3,
		TimeoutKeepAlive: 20, EnableStartupResync: false, ResyncPollInterval: 0.5, ResyncMaxWait: 0, ResyncPageSize: 200,
		StateFile: "/tmp/s.json", MetricsTopSalts: 5, InflightTTL: 2.5, LogLevel: "warn", LogFormat: "json", HA: DefaultHA(), Ingest: DefaultIngest(), Tracing: DefaultTracing()}
	if c.Sources = nil; !reflect.DeepEqual(c, want) {
		t.Fatalf("env:\n got %+v\nwant %+v", c, want)
	}
	c, err = Load([]string{"--host", "127.0.0.1", "--port", "9999", "--instance-timeout", "3", "--health-check-interval", "2",
		"--eviction-check-interval", "1", "--eviction-ratio", "1", "--trigger-watermark", "0.5", "--chunk-size", "4",
		"--hash-algorithm", "blake3", "--blend-probe-stride", "2", "--timeout-keep-alive", "30", "--state-file", "",
		"--metrics-top-salts", "0", "--inflight-ttl", "0", "--log-level", "debug", "--log-format", "upstream"}, env(e), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want = Config{Host: "127.0.0.1", Port: 9999, InstanceTimeout: 3, HealthCheckInterval: 2, EvictionCheckInterval: 1,
		EvictionRatio: 1, TriggerWatermark: 0.5, ChunkSize: 4, HashAlgorithm: "blake3", BlendProbeStride: 2,
		TimeoutKeepAlive: 30, EnableStartupResync: false, ResyncPollInterval: 0.5, ResyncMaxWait: 0, ResyncPageSize: 200,
		StateFile: "", MetricsTopSalts: 0, InflightTTL: 0, LogLevel: "debug", LogFormat: "upstream", HA: DefaultHA(), Ingest: DefaultIngest(), Tracing: DefaultTracing()}
	if c.Sources = nil; !reflect.DeepEqual(c, want) {
		t.Fatalf("flags:\n got %+v\nwant %+v", c, want)
	}
}

func TestEnvBool(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "true": true, "TRUE": true, " yes ": true, "on": true, "0": false, "False": false, "no": false, "": false, "maybe": false} {
		c, err := Load(nil, env(map[string]string{EnvPrefix + "ENABLE_STARTUP_RESYNC": v}), &bytes.Buffer{})
		if err != nil || c.EnableStartupResync != want {
			t.Errorf("%q -> %v %v", v, c.EnableStartupResync, err)
		}
	}
}

// TestInvalidValues: each rule, from a flag and from its env var, gives one
// line naming the source and the rule.
func TestInvalidValues(t *testing.T) {
	cases := []struct {
		flag, env, value, rule string
	}{
		{"--eviction-ratio", "EVICTION_RATIO", "2", "between 0.0 and 1.0"},
		{"--eviction-ratio", "EVICTION_RATIO", "-0.1", "between 0.0 and 1.0"},
		{"--trigger-watermark", "TRIGGER_WATERMARK", "0", "greater than 0.0"},
		{"--trigger-watermark", "TRIGGER_WATERMARK", "1.5", "at most 1.0"},
		{"--instance-timeout", "INSTANCE_TIMEOUT", "0", "> 0"},
		{"--health-check-interval", "HEALTH_CHECK_INTERVAL", "-1", ">= 0"},
		{"--eviction-check-interval", "EVICTION_CHECK_INTERVAL", "-1", ">= 0"},
		{"--chunk-size", "CHUNK_SIZE", "0", ">= 1"},
		{"--blend-probe-stride", "BLEND_PROBE_STRIDE", "0", ">= 1"},
		{"--timeout-keep-alive", "TIMEOUT_KEEP_ALIVE", "0", ">= 1"},
		{"--hash-algorithm", "HASH_ALGORITHM", "", "non-empty"},
		{"--hash-algorithm", "HASH_ALGORITHM", "builtin", "blake3 or sha256_cbor"},
		{"--port", "PORT", "70000", "must be a port number 0-65535 (got 70000)"},
		{"--port", "PORT", "-1", "must be a port number 0-65535 (got -1)"},
		{"--eviction-ratio", "EVICTION_RATIO", "abc", "number"},
		{"--chunk-size", "CHUNK_SIZE", "10.0", "integer"},
		{"", "RESYNC_POLL_INTERVAL", "0", "> 0"},
		{"", "RESYNC_MAX_WAIT", "-1", ">= 0"},
		{"", "RESYNC_PAGE_SIZE", "0", ">= 1"},
		{"--metrics-top-salts", "METRICS_TOP_SALTS", "10001", "between 0 and 10000"},
		{"--inflight-ttl", "INFLIGHT_TTL", "-1", ">= 0"},
		{"--log-level", "LOG_LEVEL", "loud", "one of debug, info, warn, error"},
	}
	for _, tc := range cases {
		if tc.flag != "" {
			_, err := Load([]string{tc.flag, tc.value}, env(nil), &bytes.Buffer{})
			checkErr(t, err, tc.flag, tc.rule)
		}
		_, err := Load(nil, env(map[string]string{EnvPrefix + tc.env: tc.value}), &bytes.Buffer{})
		checkErr(t, err, EnvPrefix+tc.env, tc.rule)
	}
	// A valid flag overrides an invalid env value.
	if _, err := Load([]string{"--eviction-ratio", "0.3"}, env(map[string]string{EnvPrefix + "EVICTION_RATIO": "2"}), &bytes.Buffer{}); err != nil {
		t.Fatalf("flag should win over env: %v", err)
	}
	_, err := Load([]string{"--no-such-flag"}, env(nil), &bytes.Buffer{})
	checkErr(t, err, "no-such-flag", "not defined")
	_, err = Load([]string{"stray"}, env(nil), &bytes.Buffer{})
	checkErr(t, err, "stray", "unexpected")
}

func checkErr(t *testing.T, err error, name, rule string) {
	t.Helper()
	if err == nil || !errors.Is(err, ErrInvalid) {
		t.Errorf("%s: want ErrInvalid, got %v", name, err)
		return
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, name) || !strings.Contains(msg, rule) {
		t.Errorf("%s: message %q should be one line naming %q and %q", name, msg, name, rule)
	}
}

func TestHelpListsEveryFlagWithDefault(t *testing.T) {
	var out bytes.Buffer
	_, err := Load([]string{"--help"}, env(nil), &out)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("err %v", err)
	}
	flags, envs := names()
	if len(flags) != 33 || len(envs) != 30 {
		t.Fatalf("%d flags, %d env vars", len(flags), len(envs))
	}
	text := out.String()
	for _, f := range flags {
		i := strings.Index(text, "  "+f+"\n")
		if i < 0 {
			t.Errorf("help lacks %s", f)
			continue
		}
		lines := strings.SplitN(text[i:], "\n", 3)
		if !strings.Contains(lines[1], "(default ") {
			t.Errorf("help for %s lacks its default", f)
		}
	}
	for _, e := range envs {
		if !strings.Contains(text, e) {
			t.Errorf("help lacks %s", e)
		}
	}
	for _, d := range []string{"(default 0.2; env ", "(default 9300; env ", `(default "0.0.0.0"; env `, "(default 256; env ", `(default "blake3"; env `, "(default 10; env ", "(default 30; env "} {
		if !strings.Contains(text, d) {
			t.Errorf("help lacks %s", d)
		}
	}
}

// names lists every flag (with its leading dashes) and env var.
func names() (flags, envs []string) {
	for _, fd := range fieldsTable() {
		if fd.flag != "" {
			flags = append(flags, "--"+fd.flag)
		}
		if v := fd.envVar(); v != "" {
			envs = append(envs, v)
		}
	}
	return flags, envs
}

func TestHashRootHex(t *testing.T) {
	c, err := Load([]string{"--hash-root-hex", "ABCD"}, env(nil), &bytes.Buffer{})
	if err != nil || c.HashRootHex != "ABCD" {
		t.Fatalf("flag: %+v %v", c.HashRootHex, err)
	}
	c, err = Load(nil, env(map[string]string{EnvPrefix + "HASH_ROOT_HEX": "00ff"}), &bytes.Buffer{})
	if err != nil || c.HashRootHex != "00ff" {
		t.Fatalf("env: %+v %v", c.HashRootHex, err)
	}
	_, err = Load([]string{"--hash-root-hex", "abc"}, env(nil), &bytes.Buffer{})
	checkErr(t, err, "--hash-root-hex", "even number of hex digits")
}

// TestAuthTokens: --auth-token / --mp-auth-token over their env vars, and
// neither value ever appears in --help.
func TestAuthTokens(t *testing.T) {
	e := map[string]string{EnvPrefix + "AUTH_TOKEN": "env-coord-secret", EnvPrefix + "MP_AUTH_TOKEN": "env-mp-secret"}
	c, err := Load(nil, env(e), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.AuthToken != "env-coord-secret" || c.MPAuthToken != "env-mp-secret" {
		t.Fatalf("env tokens: %q %q", c.AuthToken, c.MPAuthToken)
	}
	c, err = Load([]string{"--auth-token", "flag-coord-secret", "--mp-auth-token", "flag-mp-secret"}, env(e), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.AuthToken != "flag-coord-secret" || c.MPAuthToken != "flag-mp-secret" {
		t.Fatalf("flag tokens: %q %q", c.AuthToken, c.MPAuthToken)
	}
	var help bytes.Buffer
	if _, err := Load([]string{"--help"}, env(e), &help); !errors.Is(err, ErrHelp) {
		t.Fatalf("help: %v", err)
	}
	out := help.String()
	if !strings.Contains(out, "  --auth-token\n") || !strings.Contains(out, "  --mp-auth-token\n") {
		t.Fatalf("help lacks the token flags:\n%s", out)
	}
	if strings.Contains(out, "secret\n") || strings.Contains(out, "env-coord-secret") || strings.Contains(out, "env-mp-secret") {
		t.Fatalf("help leaks a token:\n%s", out)
	}
}

// TestConfigFile: --config-file or LMCACHE_MP_COORDINATOR_CONFIG_FILE
// supplies settings keyed by upstream's dataclass field names (the flag
// names in snake_case), below env vars and flags; env-only settings can be
// set there too; LoadSources says where each value came from.
func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "coordinator.yaml")
	body := "port: 9400\neviction_ratio: 0.5\nchunk_size: 16\nresync_page_size: 50\nenable_startup_resync: false\nauth_token: file-secret\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	e := env(map[string]string{EnvConfigFile: path, EnvPrefix + "CHUNK_SIZE": "32"})
	c, src, err := LoadSources([]string{"--eviction-ratio", "0.7"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Port != 9400 || c.EvictionRatio != 0.7 || c.ChunkSize != 32 || c.ResyncPageSize != 50 || c.EnableStartupResync || c.AuthToken != "file-secret" {
		t.Fatalf("got %+v", c)
	}
	for key, want := range map[string]string{
		"port": "file:" + path, "eviction_ratio": "flag:--eviction-ratio", "chunk_size": "env:" + EnvPrefix + "CHUNK_SIZE",
		"resync_page_size": "file:" + path, "host": "default",
	} {
		if src[key] != want {
			t.Errorf("source of %s = %q, want %q", key, src[key], want)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("port: 9400\nprot: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load([]string{"--config-file", bad}, env(nil), &bytes.Buffer{})
	if !errors.Is(err, ErrInvalid) || err.Error() != `--config-file: `+bad+` line 2: unknown key "prot"` {
		t.Errorf("bad key: %v", err)
	}
	if err := os.WriteFile(bad, []byte("resync_page_size: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(nil, env(map[string]string{EnvConfigFile: bad}), &bytes.Buffer{})
	if !errors.Is(err, ErrInvalid) || err.Error() != EnvPrefix+`RESYNC_PAGE_SIZE: `+bad+` line 1: must be >= 1 (got 0)` {
		t.Errorf("bad env-only value: %v", err)
	}
	_, err = Load([]string{"--port", "x"}, env(nil), &bytes.Buffer{})
	if err == nil || err.Error() != `--port: not an integer (got "x")` {
		t.Errorf("--port x: %v", err)
	}
}

// TestLogFormat: LMCACHE_LOG_FORMAT is a setting of the coordinator's flag
// table, as the server's: --log-format wins over it, case is ignored, GET
// /config reports it with its source, and a bad value is one line in the
// layer's shape.
func TestLogFormat(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
		src  string
	}{
		{nil, nil, "text", "default"},
		{nil, map[string]string{"LMCACHE_LOG_FORMAT": "Upstream"}, "upstream", "env:LMCACHE_LOG_FORMAT"},
		{[]string{"--log-format", "json"}, map[string]string{"LMCACHE_LOG_FORMAT": "xml"}, "json", "flag:--log-format"},
	} {
		c, src, err := LoadSources(tc.args, env(tc.env), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v %v: %v", tc.args, tc.env, err)
		}
		if c.LogFormat != tc.want || src["log_format"] != tc.src {
			t.Errorf("%v %v: %q from %q, want %q from %q", tc.args, tc.env, c.LogFormat, src["log_format"], tc.want, tc.src)
		}
		v := View(c)
		if v[Group]["log_format"] != tc.want || v[SourcesKey][Group].(map[string]any)["log_format"] != tc.src {
			t.Errorf("%v %v: View %v / %v", tc.args, tc.env, v[Group]["log_format"], v[SourcesKey][Group])
		}
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"LMCACHE_LOG_FORMAT": "xml"}, `--log-format: LMCACHE_LOG_FORMAT: must be one of text, json, upstream (got "xml")`},
		{[]string{"--log-format", "xml"}, nil, `--log-format: must be one of text, json, upstream (got "xml")`},
		{[]string{"-log-format", "xml"}, nil, `--log-format: must be one of text, json, upstream (got "xml")`},
	} {
		_, err := Load(tc.args, env(tc.env), &bytes.Buffer{})
		if !errors.Is(err, ErrInvalid) || err.Error() != tc.want {
			t.Errorf("%v %v:\n got %v\nwant %s", tc.args, tc.env, err, tc.want)
		}
	}
	var help bytes.Buffer
	if _, err := Load([]string{"--help"}, env(nil), &help); !errors.Is(err, ErrHelp) {
		t.Fatal(err)
	}
	if !strings.Contains(help.String(), "  --log-format\n") || !strings.Contains(help.String(), `(default "text"; env LMCACHE_LOG_FORMAT)`) {
		t.Errorf("help lacks --log-format with its variable and default:\n%s", help.String())
	}
}

// TestMPTokenNeedsAuthToken: --mp-auth-token on a coordinator that others
// can reach needs --auth-token (else an open POST /instances lets anyone
// register an address and be sent the MP token); a loopback --host, or
// both tokens, is accepted. The error never quotes the token.
func TestMPTokenNeedsAuthToken(t *testing.T) {
	const rule = "needs --auth-token unless --host is a loopback address: without it anyone who reaches the coordinator can register an instance at an address of theirs and be sent this token"
	for _, tc := range []struct {
		args []string
		env  map[string]string
		ok   bool
	}{
		{[]string{"--mp-auth-token", "mp-secret-1"}, nil, false}, // default --host 0.0.0.0
		{[]string{"--mp-auth-token", "mp-secret-1", "--host", "10.0.0.5"}, nil, false},
		{[]string{"--mp-auth-token", "mp-secret-1", "--host", "::"}, nil, false},
		{nil, map[string]string{EnvPrefix + "MP_AUTH_TOKEN": "mp-secret-1"}, false},
		{[]string{"--mp-auth-token", "mp-secret-1", "--host", "127.0.0.1"}, nil, true},
		{[]string{"--mp-auth-token", "mp-secret-1", "--host", "::1"}, nil, true},
		{[]string{"--mp-auth-token", "mp-secret-1", "--host", "localhost"}, nil, true},
		{[]string{"--mp-auth-token", "mp-secret-1", "--auth-token", "coord-secret-2"}, nil, true},
		{nil, nil, true},
	} {
		_, err := Load(tc.args, env(tc.env), &bytes.Buffer{})
		want := "--mp-auth-token: " + rule
		if tc.env != nil {
			want = "--mp-auth-token: " + EnvPrefix + "MP_AUTH_TOKEN: " + rule
		}
		switch {
		case tc.ok && err != nil:
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		case !tc.ok && (err == nil || err.Error() != want || !errors.Is(err, ErrInvalid)):
			t.Errorf("%v %v:\n got %v\nwant %s", tc.args, tc.env, err, want)
		case err != nil && strings.Contains(err.Error(), "mp-secret-1"):
			t.Errorf("%v: the error quotes the token: %v", tc.args, err)
		}
	}
}
