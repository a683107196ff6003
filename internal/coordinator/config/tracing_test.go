package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/redact"
)

// TestTracingFlags: --enable-tracing, --otlp-endpoint and --trace-level are
// the server's names, with LMCACHE_MP_COORDINATOR_* variables (upstream's
// coordinator spells OTLP_ENDPOINT so) and config-file keys; tracing is off
// by default; enabling it without an endpoint, or a level other than
// storage or events, is one error line.
func TestTracingFlags(t *testing.T) {
	c, err := Load(nil, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing != (Tracing{Level: "storage"}) {
		t.Fatalf("default tracing %+v", c.Tracing)
	}
	c, err = Load([]string{"--enable-tracing", "--otlp-endpoint", "http://127.0.0.1:4317", "--trace-level", "events"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing != (Tracing{Enabled: true, Endpoint: "http://127.0.0.1:4317", Level: "events"}) {
		t.Fatalf("flags: %+v", c.Tracing)
	}
	c, err = Load(nil, env(map[string]string{EnvPrefix + "ENABLE_TRACING": "true", EnvPrefix + "OTLP_ENDPOINT": "collector:4317", EnvPrefix + "TRACE_LEVEL": "events"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing != (Tracing{Enabled: true, Endpoint: "collector:4317", Level: "events"}) {
		t.Fatalf("env: %+v", c.Tracing)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("enable_tracing: true\notlp_endpoint: https://otel:4317\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load([]string{"--config-file", path}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing != (Tracing{Enabled: true, Endpoint: "https://otel:4317", Level: "storage"}) {
		t.Fatalf("file: %+v", c.Tracing)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--enable-tracing"}, nil, "--enable-tracing: requires --otlp-endpoint (an OTLP gRPC endpoint such as http://localhost:4317) (got True)"},
		{[]string{"--trace-level", "deep"}, nil, `--trace-level: must be storage or events (got "deep")`},
		{nil, map[string]string{EnvPrefix + "ENABLE_TRACING": "maybe"}, `--enable-tracing: ` + EnvPrefix + `ENABLE_TRACING: not a boolean (got "maybe")`},
	} {
		_, err := Load(tc.args, env(tc.env), &bytes.Buffer{})
		if !errors.Is(err, ErrInvalid) || err.Error() != tc.want {
			t.Errorf("%v %v: %v, want %q", tc.args, tc.env, err, tc.want)
		}
	}
	var help bytes.Buffer
	if _, err := Load([]string{"--help"}, env(nil), &help); !errors.Is(err, ErrHelp) {
		t.Fatal(err)
	}
	if !strings.Contains(help.String(), "  --enable-tracing\n") || !strings.Contains(help.String(), "(default \"\"; env "+EnvPrefix+"OTLP_ENDPOINT)") {
		t.Errorf("help lacks the tracing flags:\n%s", help.String())
	}
}

// TestViewSources: View (the body of GET /config) has every setting under
// "coordinator" and where it came from under "_sources": a flag over an
// env var over the config file over the default, each layer named; a token
// set in any layer is the redaction marker and never appears in the JSON.
func TestViewSources(t *testing.T) {
	const fileTok, envTok = "file-tok-91c2", "env-mp-tok-4d7e"
	path := filepath.Join(t.TempDir(), "coordinator.yaml")
	body := "port: 9400\neviction_ratio: 0.5\nchunk_size: 16\ninstance_timeout: 7\nauth_token: " + fileTok + "\nresync_page_size: 50\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	e := env(map[string]string{EnvConfigFile: path, EnvPrefix + "CHUNK_SIZE": "32", EnvPrefix + "EVICTION_RATIO": "0.6", EnvPrefix + "MP_AUTH_TOKEN": envTok})
	c, err := Load([]string{"--eviction-ratio", "0.7", "--enable-tracing", "--otlp-endpoint", "127.0.0.1:4317"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(View(c))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), fileTok) || strings.Contains(string(raw), envTok) {
		t.Fatalf("view carries a token: %s", raw)
	}
	var got map[string]map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	values := got[Group]
	want := map[string]any{
		"eviction_ratio": 0.7, "chunk_size": 32.0, "port": 9400.0, "instance_timeout": 7.0, "resync_page_size": 50.0,
		"trigger_watermark": 1.0, "host": "0.0.0.0", "enable_startup_resync": true, "enable_tracing": true,
		"otlp_endpoint": "127.0.0.1:4317", "trace_level": "storage", "auth_token": redact.Marker, "mp_auth_token": redact.Marker,
		"state_file": "", "event_transport": "http",
	}
	for k, w := range want {
		if values[k] != w {
			t.Errorf("%s = %#v, want %#v", k, values[k], w)
		}
	}
	sources := got[SourcesKey][Group].(map[string]any)
	wantSrc := map[string]string{
		"eviction_ratio": "flag:--eviction-ratio", "chunk_size": "env:" + EnvPrefix + "CHUNK_SIZE", "port": "file:" + path,
		"instance_timeout": "file:" + path, "resync_page_size": "file:" + path, "trigger_watermark": "default", "host": "default",
		"enable_tracing": "flag:--enable-tracing", "auth_token": "file:" + path, "mp_auth_token": "env:" + EnvPrefix + "MP_AUTH_TOKEN",
		"event_transport": "default",
	}
	for k, w := range wantSrc {
		if sources[k] != w {
			t.Errorf("_sources.%s = %#v, want %q", k, sources[k], w)
		}
	}
	if len(values) != len(fieldsTable()) || len(sources) != len(values) || len(got) != 2 {
		t.Errorf("%d values, %d sources, %d top-level keys for %d settings", len(values), len(sources), len(got), len(fieldsTable()))
	}
	built := View(Default())
	if built[SourcesKey][Group].(map[string]any)["port"] != SourceUnknown || built[Group]["auth_token"] != "" {
		t.Errorf("a Config built in code: %v", built)
	}
}
