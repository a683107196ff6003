package main

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/bench"
	"github.com/lmcache-go/lmcache/internal/coordclient"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/serverconfig"
)

// runCmd runs `lmcache <args>` in-process and returns its exit status,
// stdout and stderr.
func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := dispatch(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// wantUsageLine checks the flag layer's contract: exit status 2, nothing
// on stdout, and exactly the one line want on stderr.
func wantUsageLine(t *testing.T, args []string, want string) {
	t.Helper()
	code, out, errOut := runCmd(t, args...)
	if code != 2 || out != "" || errOut != want+"\n" {
		t.Errorf("lmcache %q: status %d, stdout %q, stderr %q; want 2, \"\", %q", args, code, out, errOut, want+"\n")
	}
}

// TestBenchBadValuesOneLine: `lmcache bench` is on the shared flag layer:
// a bad value is one line "lmcache bench: --<flag>: <reason>" and exit 2
// (no usage dump), with the server's reason texts.
func TestBenchBadValuesOneLine(t *testing.T) {
	for args, want := range map[string]string{
		"--workers x":              `--workers: not an integer (got "x")`,
		"-workers x":               `--workers: not an integer (got "x")`,
		"--workers 0":              `--workers: must be >= 1 (got 0)`,
		"--warmup -1":              `--warmup: must be >= 0 (got -1)`,
		"--num-layers 0":           `--num-layers: must be >= 1 (got 0)`,
		"--dtype fp99":             `--dtype: unsupported dtype (got "fp99"); want e.g. float16, bfloat16, float32, uint8, float8_e4m3fn`,
		"--timeout 5":              `--timeout: not a duration such as 3s or 500ms (got "5")`,
		"--timeout 0s":             `--timeout: must be > 0 (got 0s)`,
		"--progress -1s":           `--progress: must be >= 0 (got -1s)`,
		"--mla=maybe":              `--mla: not a boolean (got "maybe")`,
		"--report x.png":           `--report: want a .svg or .html file (got "x.png")`,
		"--inprocess-l1-gb -1":     `--inprocess-l1-gb: must be finite and >= 0 (got -1)`,
		"--inprocess-chunk-size 0": `--inprocess-chunk-size: must be >= 1 (got 0)`,
		"--no-such-flag":           `--no-such-flag: flag provided but not defined`,
		"--workers":                `--workers: flag needs an argument`,
		"stray":                    `unexpected argument "stray"`,
	} {
		wantUsageLine(t, append([]string{"bench"}, strings.Fields(args)...), "lmcache bench: "+want)
	}
}

// TestBenchHelp: --help prints every flag with its default on stdout and
// exits 0; nothing goes to stderr.
func TestBenchHelp(t *testing.T) {
	code, out, errOut := runCmd(t, "bench", "--help")
	if code != 0 || errOut != "" {
		t.Fatalf("status %d, stderr %q", code, errOut)
	}
	f, err := parseBenchFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range f.set.Entries() {
		if !strings.Contains(out, "  --"+e.Name+"\n      "+e.Usage+" (default "+e.Default+")\n") {
			t.Errorf("--help lacks --%s with its default %s", e.Name, e.Default)
		}
	}
	for _, want := range []string{`(default "tcp://127.0.0.1:5555")`, "(default 3s)", "in MiB (the pool's size compares like with like) (default 256)", "server (default 256)"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// TestBenchFlagsKeepNamesAndDefaults: the move to the flag layer kept
// every flag name the flag package version had, and its defaults
// (bench.Defaults, and the subcommand's own).
func TestBenchFlagsKeepNamesAndDefaults(t *testing.T) {
	f, err := parseBenchFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range f.set.Entries() {
		names = append(names, e.Name)
	}
	want := "endpoint shm-dir workers requests warmup model num-layers hidden-dim-size dtype mla prompt-tokens lookup-tokens lookup-samples ping-clients ping-duration progress timeout baseline-mib json report inprocess-l1-gb inprocess-chunk-size"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("flags\n got %s\nwant %s", got, want)
	}
	if !reflect.DeepEqual(f.o, bench.Defaults()) || f.baseMiB != 256 || f.asJSON || f.report != "" || f.inprocGB != 0 || f.chunk != 256 {
		t.Errorf("defaults: %+v", f)
	}
	f, err = parseBenchFlags(strings.Fields(`--endpoint tcp://h:1 --shm-dir /x --workers 3 --requests 5 --warmup 0 --model m
		--num-layers 2 --hidden-dim-size 64 --dtype bfloat16 --mla --prompt-tokens 512 --lookup-tokens 0 --lookup-samples 7
		--ping-clients 0 --ping-duration 1s --progress 0s --timeout 2m --baseline-mib 8 --json --report r.html
		--inprocess-l1-gb 0.5 --inprocess-chunk-size 16`))
	if err != nil {
		t.Fatal(err)
	}
	wantO := bench.Options{Endpoint: "tcp://h:1", ShmDir: "/x", Workers: 3, Requests: 5, Warmup: 0, Model: "m", Layers: 2, Hidden: 64,
		Dtype: "bfloat16", MLA: true, PromptTokens: 512, LookupTokens: 0, LookupSamples: 7, PingClients: 0, PingDuration: time.Second,
		Progress: 0, Timeout: 2 * time.Minute, BaselineBytes: 8 << 20}
	if !reflect.DeepEqual(f.o, wantO) || !f.asJSON || f.report != "r.html" || f.inprocGB != 0.5 || f.chunk != 16 {
		t.Errorf("parsed %+v\nwant options %+v", f, wantO)
	}
}

// TestCoordinatorFlagErrorsOneLine: LMCACHE_LOG_FORMAT is read by the
// coordinator's flag table, so its error has the layer's shape as the
// port's does; --port's reason is the server's.
func TestCoordinatorFlagErrorsOneLine(t *testing.T) {
	t.Setenv("LMCACHE_LOG_FORMAT", "xml")
	wantUsageLine(t, []string{"coordinator"}, `lmcache coordinator: --log-format: LMCACHE_LOG_FORMAT: must be one of text, json, upstream (got "xml")`)
	t.Setenv("LMCACHE_LOG_FORMAT", "text")
	wantUsageLine(t, []string{"coordinator", "--port", "70000"}, `lmcache coordinator: --port: must be a port number 0-65535 (got 70000)`)
	t.Setenv("LMCACHE_MP_COORDINATOR_PORT", "x")
	wantUsageLine(t, []string{"coordinator"}, `lmcache coordinator: --port: LMCACHE_MP_COORDINATOR_PORT: not an integer (got "x")`)
}

// TestServerFlagErrorsOneLine: the server's bad inputs that used to fail
// late, in another shape, or not at all, are one flag line and exit 2.
func TestServerFlagErrorsOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shm-name", "a/b"}, `--shm-name: must be one name without "/" (a leading one is dropped) (got "a/b")`},
		{[]string{"--port", "70000"}, `--port: must be a port number 0-65535 (got 70000)`},
		{[]string{"--p2p-host", "x"}, `--p2p-host: flag provided but not defined`},
		{[]string{"--lookup-hash-log-dir", "x"}, `--lookup-hash-log-dir: flag provided but not defined`},
		{[]string{"--l1-manager", "x"}, `--l1-manager: flag provided but not defined`},
		{[]string{"-chunk-size", "x"}, `--chunk-size: not an integer (got "x")`},
		{[]string{"--l2-adapter", `{"type":"bogus"}`}, `--l2-adapter: #1: unknown adapter type 'bogus'. Known: ` + strings.Join(l2.RegisteredTypes(), ", ")},
	} {
		wantUsageLine(t, append([]string{"server"}, tc.args...), "lmcache server: "+tc.want)
	}
	// The JSON error's detail is encoding/json's; the line's shape is ours.
	code, out, errOut := runCmd(t, "server", "--l2-adapter", "{bad")
	if code != 2 || out != "" || !strings.HasPrefix(errOut, "lmcache server: --l2-adapter: #1: invalid JSON: ") || strings.Count(errOut, "\n") != 1 || strings.Count(errOut, "l2-adapter") != 1 {
		t.Errorf("--l2-adapter {bad: status %d, stderr %q", code, errOut)
	}
	t.Setenv(serverconfig.EnvProtectMetrics, "maybe")
	wantUsageLine(t, []string{"server"}, `lmcache server: --http-auth-protect-metrics: LMCACHE_HTTP_AUTH_PROTECT_METRICS: not a boolean (got "maybe")`)
}

// TestL2AdapterErrorKeepsChain: the rephrased error still is l2.ErrConfig,
// and each of l2's message shapes names the flag once.
func TestL2AdapterErrorKeepsChain(t *testing.T) {
	for in, want := range map[string]string{
		`{bad`:             "--l2-adapter: #1: invalid JSON: ",
		`{"type":"bogus"}`: "--l2-adapter: #1: unknown adapter type 'bogus'",
		`[]`:               "--l2-adapter: #1: expected a JSON object",
		`{"type":"fs"}`:    "--l2-adapter: #1 ('fs'): base_path is required",
	} {
		_, err := l2.ParseSpecs([]string{in})
		if err == nil {
			t.Fatalf("%s: no error", in)
		}
		got := l2AdapterError(err)
		if !errors.Is(got, l2.ErrConfig) || !strings.HasPrefix(got.Error(), want) || strings.Count(got.Error(), "l2-adapter") != 1 {
			t.Errorf("%s: %q (from %q), want prefix %q naming the flag once", in, got, err, want)
		}
	}
}

// TestProtectMetricsVariable: the flag table's variable is the one httpapi
// documents, so LMCACHE_HTTP_AUTH_PROTECT_METRICS=1 keeps protecting
// /metrics.
func TestProtectMetricsVariable(t *testing.T) {
	if serverconfig.EnvProtectMetrics != httpapi.EnvProtectMetrics {
		t.Fatalf("serverconfig reads %s, httpapi documents %s", serverconfig.EnvProtectMetrics, httpapi.EnvProtectMetrics)
	}
	cfg, err := serverconfig.ParseEnv(nil, func(k string) (string, bool) { return "1", k == httpapi.EnvProtectMetrics }, nil)
	if err != nil || !cfg.HTTPAuthProtectMetrics {
		t.Fatalf("=1: %v %v", cfg, err)
	}
}

// TestL1LazyFlagsHaveNoEffect: --l1-use-lazy / --no-l1-use-lazy and
// --l1-init-size-gb are accepted and change nothing the engine is given.
func TestL1LazyFlagsHaveNoEffect(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	base, err := serverconfig.ParseEnv(nil, none, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := engineConfig(base)
	if want.L1SizeBytes != 1<<30 {
		t.Fatalf("base engine config %+v", want)
	}
	for _, args := range [][]string{
		{"--no-l1-use-lazy"}, {"--l1-use-lazy"}, {"--l1-init-size-gb", "5"}, {"--no-l1-use-lazy", "--l1-init-size-gb", "0.5"},
	} {
		cfg, err := serverconfig.ParseEnv(args, none, nil)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if got := engineConfig(cfg); !reflect.DeepEqual(got, want) {
			t.Errorf("%v: engine config\n got %+v\nwant %+v", args, got, want)
		}
	}
}

// TestCoordClientConfigFromFlags: the coordinator client gets the server's
// coordinator flags and --event-bus-queue-size as its event-queue bound
// (whose enforcement is coordclient.TestBatchesSeqRetryAndBoundedQueue's),
// each value as given, the intervals in seconds.
func TestCoordClientConfigFromFlags(t *testing.T) {
	cfg, err := serverconfig.ParseEnv([]string{"--event-bus-queue-size", "7", "--coordinator-url", "http://127.0.0.1:9000",
		"--coordinator-advertise-ip", "10.0.0.5", "--http-port", "8181", "--coordinator-heartbeat-interval", "2.5",
		"--coordinator-event-reporting", "--coordinator-event-flush-interval", "0.25", "--coordinator-auth-token", "tok",
		"--coordinator-event-endpoint", "events"}, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := coordClientConfig(cfg, "inst-1")
	want := coordclient.Config{URL: "http://127.0.0.1:9000", AdvertiseIP: "10.0.0.5", HTTPPort: 8181, InstanceID: "inst-1",
		HeartbeatInterval: 2500 * time.Millisecond, EventReporting: true, EventFlushInterval: 250 * time.Millisecond,
		QueueSize: 7, AuthToken: "tok", EventEndpoint: "events"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("coordinator client config\n got %+v\nwant %+v", got, want)
	}
}
