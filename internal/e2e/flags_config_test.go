package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestFlagErrorsOneLineExitTwo: both subcommands report a bad flag,
// variable or config-file entry as exactly one line,
// "lmcache <command>: --<flag>: <reason>", and exit 2.
func TestFlagErrorsOneLineExitTwo(t *testing.T) {
	dir := t.TempDir()
	badKey := filepath.Join(dir, "bad-key.yaml")
	badValue := filepath.Join(dir, "bad-value.yaml")
	coordBad := filepath.Join(dir, "coord.yaml")
	for path, body := range map[string]string{
		badKey:   "chunk_size: 512\nchunk_sise: 1\n",
		badValue: "l1_size_gb: 1\nchunk_size: many\n",
		coordBad: "port: 9400\nprot: 1\n",
	} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"server", "--chunk-size", "x"}, `lmcache server: --chunk-size: not an integer (got "x")`},
		{nil, []string{"coordinator", "--port", "x"}, `lmcache coordinator: --port: not an integer (got "x")`},
		{nil, []string{"server", "--no-such-flag"}, `lmcache server: --no-such-flag: flag provided but not defined`},
		{nil, []string{"coordinator", "--no-such-flag"}, `lmcache coordinator: --no-such-flag: flag provided but not defined`},
		{[]string{"LMCACHE_MP_COORDINATOR_PORT=x"}, []string{"coordinator"}, `lmcache coordinator: --port: LMCACHE_MP_COORDINATOR_PORT: not an integer (got "x")`},
		{nil, []string{"server", "--config-file", badKey}, `lmcache server: --config-file: ` + badKey + ` line 2: unknown key "chunk_sise"`},
		{[]string{"LMCACHE_CONFIG_FILE=" + badValue}, []string{"server"}, `lmcache server: --chunk-size: ` + badValue + ` line 2: not an integer (got "many")`},
		{[]string{"LMCACHE_MP_COORDINATOR_CONFIG_FILE=" + coordBad}, []string{"coordinator"}, `lmcache coordinator: --config-file: LMCACHE_MP_COORDINATOR_CONFIG_FILE: ` + coordBad + ` line 2: unknown key "prot"`},
	}
	for _, c := range cases {
		code, stdout, stderr := runBin(t, c.env, c.args...)
		if code != 2 || stderr != c.want+"\n" || stdout != "" {
			t.Errorf("%v %v: exit %d, stderr %q, stdout %q; want 2 and %q", c.env, c.args, code, stderr, stdout, c.want)
		}
	}
}

// TestServerConfigFileAndSources starts the real binary from a config file
// with an environment variable and a flag on top, and reads GET /config
// over HTTP: the values come from the right layer, "_sources" says so, and
// the token the file set guards the route without appearing in the body.
func TestServerConfigFileAndSources(t *testing.T) {
	httpPort, zmqPort := freePort(t), freePort(t)
	const token = "file-token-7f3a9c"
	path := filepath.Join(t.TempDir(), "server.yaml")
	body := "chunk_size: 32\nl1_size_gb: 0.25\neviction_ratio: 0.5\nhost: 127.0.0.1\nport: " + itoa(zmqPort) +
		"\nhttp_port: " + itoa(httpPort) + "\nhttp_auth_token: " + token + "\nlog_level: WARNING\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, "server-config-file", []string{"LMCACHE_LOG_LEVEL=ERROR"}, "server", "--config-file", path, "--eviction-ratio", "0.3")
	base := "http://127.0.0.1:" + itoa(httpPort)
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))

	if code, _ := call(t, "GET", base+"/config", nil, nil, nil); code != 401 {
		t.Fatalf("GET /config without the file's token = %d, want 401", code)
	}
	var cfg map[string]map[string]any
	code, _ := call(t, "GET", base+"/config", nil, map[string]string{"Authorization": "Bearer " + token}, &cfg)
	if code != 200 {
		t.Fatalf("GET /config = %d", code)
	}
	if cfg["mp"]["chunk_size"] != 32.0 || cfg["storage_manager"]["l1_size_gb"] != 0.25 || cfg["storage_manager"]["eviction_ratio"] != 0.3 ||
		cfg["http"]["log_level"] != "ERROR" || cfg["http"]["http_port"] != float64(httpPort) {
		t.Fatalf("GET /config values: %v", cfg)
	}
	want := map[string]map[string]string{
		"mp":              {"chunk_size": "file:" + path, "port": "file:" + path, "max_workers": "default"},
		"storage_manager": {"l1_size_gb": "file:" + path, "eviction_ratio": "flag:--eviction-ratio"},
		"http":            {"log_level": "env:LMCACHE_LOG_LEVEL", "http_port": "file:" + path},
	}
	for group, keys := range want {
		for key, w := range keys {
			if got := cfg["_sources"][group].(map[string]any)[key]; got != w {
				t.Errorf("_sources.%s.%s = %v, want %q", group, key, got, w)
			}
		}
	}
	for group, keys := range cfg {
		if group == "_sources" {
			continue
		}
		src := cfg["_sources"][group].(map[string]any)
		for key := range keys {
			if _, ok := src[key]; !ok {
				t.Errorf("_sources.%s lacks %s", group, key)
			}
		}
	}
	var raw []byte
	rawCode, _ := call(t, "GET", base+"/config", nil, map[string]string{"Authorization": "Bearer " + token}, &rawJSON{&raw})
	if rawCode != 200 || strings.Contains(string(raw), token) {
		t.Errorf("GET /config = %d and must never carry the token", rawCode)
	}
}

// rawJSON captures a response body as call decodes it.
type rawJSON struct{ b *[]byte }

func (r *rawJSON) UnmarshalJSON(b []byte) error { *r.b = append([]byte(nil), b...); return nil }

// TestServerLogFormatUpstream: `lmcache server --log-format upstream`
// writes upstream's line shape (internal/loglevel/upstream.go):
// "<colour>[YYYY-MM-DD hh:mm:ss,mmm] LMCache INFO:<reset> msg k=v <italic>(file.go:N:logger)<reset>".
func TestServerLogFormatUpstream(t *testing.T) {
	httpPort := freePort(t)
	p := start(t, "server-upstream-log", nil, "server", "--log-format", "upstream", "--host", "127.0.0.1",
		"--port", itoa(freePort(t)), "--http-port", itoa(httpPort), "--l1-size-gb", "0.25")
	waitFor(t, "healthcheck", healthy("http://127.0.0.1:"+itoa(httpPort)+"/healthcheck"))
	line := regexp.MustCompile(`(?m)^\x1b\[32;20m\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] LMCache INFO:\x1b\[0m lmcache server started http=127\.0\.0\.1:` +
		itoa(httpPort) + ` zmq=\S+ pool=\S* \x1b\[3m\(server\.go:\d+:lmcache\)\x1b\[0m$`)
	waitFor(t, "the started line", func() bool { return line.MatchString(p.Output(t)) })
}
