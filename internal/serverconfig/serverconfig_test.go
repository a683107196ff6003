package serverconfig

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	c, err := ParseEnv(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPHost != "127.0.0.1" || c.HTTPPort != 8080 || c.Host != "localhost" || c.Port != 5555 ||
		c.ChunkSize != 256 || c.HashAlgorithm != "blake3" || c.L1SizeGB != DefaultL1SizeGB ||
		c.EvictionPolicy != "LRU" || c.EvictionWatermark != 0.8 || c.EvictionRatio != 0.2 ||
		c.L1ReadTTLSeconds != 300 || c.L1WriteTTLSeconds != 600 || c.L1AlignBytes != 4096 ||
		!c.L1UseLazy || c.CoordinatorHeartbeatInterval != 5 || len(c.L2Adapters) != 0 || c.MaxQueuedRequests != 4096 ||
		c.GCHeapFloorMB != 64 || c.ZMQBusyPollUS != 0 {
		t.Fatalf("defaults: %+v", c)
	}
	if c.L1SizeBytes() != 1<<30 || c.L1InitSizeBytes() != 1<<30 {
		t.Errorf("sizes %d %d", c.L1SizeBytes(), c.L1InitSizeBytes())
	}
	g := c.Groups()
	if g[GroupMP]["chunk_size"] != 256 || g[GroupStorage]["l1_size_gb"] != 1.0 || g[GroupObservability]["event_bus_queue_size"] != 10000 {
		t.Errorf("groups: %v", g)
	}
	if _, leaked := g[GroupHTTP]["http_auth_token"]; leaked {
		t.Error("auth token must not appear in /config")
	}
}

func TestUpstreamCommandLine(t *testing.T) {
	args := strings.Fields(`--l1-size-gb 100 --eviction-policy IsolatedLRU --chunk-size 512 --http-host 0.0.0.0 --http-port 9000
		--no-l1-use-lazy --script-allowed-imports math json --run-script-api-enabled
		--l2-adapter {"type":"fs","base_path":"/tmp/x"} --l2-adapter {"type":"s3"}`)
	c, err := ParseEnv(args, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.L1SizeBytes() != 100<<30 || c.EvictionPolicy != "IsolatedLRU" || c.ChunkSize != 512 || c.HTTPHost != "0.0.0.0" ||
		c.HTTPPort != 9000 || c.L1UseLazy || !c.RunScriptAPIEnabled {
		t.Fatalf("parsed %+v", c)
	}
	if strings.Join(c.ScriptAllowedImports, ",") != "math,json" || len(c.L2Adapters) != 2 || c.L2Adapters[1] != `{"type":"s3"}` {
		t.Fatalf("lists: %q %q", c.ScriptAllowedImports, c.L2Adapters)
	}
}

func TestCoordinatorPrecedence(t *testing.T) {
	e := env(map[string]string{
		"LMCACHE_COORDINATOR_URL":                     "http://env:9300",
		"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL":      "2.5",
		"LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL": "7",
		"LMCACHE_COORDINATOR_EVENT_REPORTING":         "yes",
	})
	c, err := ParseEnv(nil, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CoordinatorURL != "http://env:9300" || c.CoordinatorHeartbeatInterval != 2.5 || c.CoordinatorEventFlushInterval != 7 || !c.CoordinatorEventReporting {
		t.Fatalf("env: %+v", c)
	}
	// flag > deprecated flag > env.
	c, err = ParseEnv([]string{"--coordinator-l2-event-flush-interval", "3", "--coordinator-url", "http://flag"}, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CoordinatorEventFlushInterval != 3 || c.CoordinatorURL != "http://flag" {
		t.Fatalf("deprecated flag: %+v", c)
	}
	c, err = ParseEnv([]string{"--coordinator-l2-event-flush-interval", "3", "--coordinator-event-flush-interval", "4"}, e, nil)
	if err != nil || c.CoordinatorEventFlushInterval != 4 {
		t.Fatalf("new flag must win: %v %+v", err, c)
	}
	c, err = ParseEnv([]string{"--coordinator-l2-event-reporting"}, env(nil), nil)
	if err != nil || !c.CoordinatorEventReporting {
		t.Fatalf("deprecated bool flag: %v", err)
	}
}

func TestInvalidValuesNameTheFlag(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--eviction-ratio", "2"}, nil, "--eviction-ratio: must satisfy 0 <= x <= 1 (got 2)"},
		{[]string{"--eviction-trigger-watermark", "0"}, nil, "--eviction-trigger-watermark: must satisfy 0 < x <= 1 (got 0)"},
		{[]string{"--l1-align-bytes", "3000"}, nil, "--l1-align-bytes: must be a power of two (got 3000)"},
		{[]string{"--eviction-policy", "FIFO"}, nil, `--eviction-policy: must be one of LRU, IsolatedLRU, noop (got "FIFO")`},
		{[]string{"--worker-reap-timeout-seconds", "10"}, nil, "--worker-reap-timeout-seconds: must be 0 or finite and >= 30 (got 10)"},
		{[]string{"--chunk-size", "x"}, nil, `--chunk-size: not an integer (got "x")`},
		{nil, map[string]string{"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL": "0"}, "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL: must be finite and > 0 (got 0)"},
		{nil, map[string]string{"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL": "abc"}, `--coordinator-heartbeat-interval: LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL: not a number (got "abc")`},
		{[]string{"--hash-root-hex", "abc"}, nil, "--hash-root-hex: must have an even number of hex digits (got 3)"},
		{[]string{"--l2-lookup-timeout-ms", "-1"}, nil, "--l2-lookup-timeout-ms: must be >= 0 (got -1)"},
		{nil, map[string]string{"LMCACHE_L2_LOOKUP_TIMEOUT_MS": "-5"}, "LMCACHE_L2_LOOKUP_TIMEOUT_MS: must be >= 0 (got -5)"},
		{[]string{"stray"}, nil, `unexpected argument "stray"`},
		{[]string{"--no-such-flag"}, nil, "--no-such-flag: flag provided but not defined"},
	}
	for _, c := range cases {
		_, err := ParseEnv(c.args, env(c.env), nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v %v: err = %v, want one line containing %q", c.args, c.env, err, c.want)
		}
	}
}

func TestHelpListsEveryFlagWithDefault(t *testing.T) {
	var buf bytes.Buffer
	_, err := ParseEnv([]string{"--help"}, env(nil), &buf)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	out := buf.String()
	c := &Config{}
	r := c.register()
	for _, e := range r.set.Entries() {
		if e.Hidden {
			if strings.Contains(out, "--"+e.Name+"\n") {
				t.Errorf("deprecated --%s listed", e.Name)
			}
			continue
		}
		if !strings.Contains(out, "--"+e.Name) {
			t.Errorf("--help misses --%s", e.Name)
		}
		// Every flag's entry states its default and, where it has one,
		// its env variable.
		want := "(default " + e.Default
		if e.Env != "" {
			want += "; env " + e.Env + ")"
		}
		i := strings.Index(out, "  --"+e.Name+"\n")
		if i < 0 {
			i = strings.Index(out, "  --"+e.Name+" / --no-"+e.Name+"\n")
		}
		if i < 0 {
			t.Errorf("--help has no line of its own for --%s", e.Name)
		} else if entry := strings.SplitN(out[i:], ")\n", 2)[0] + ")"; !strings.Contains(entry, want) {
			t.Errorf("--help entry of --%s lacks %q", e.Name, want)
		}
	}
	for _, want := range []string{"--l1-size-gb\n      L1 size in GiB (default 1)", "--l1-use-lazy / --no-l1-use-lazy", `(default "127.0.0.1")`, "env LMCACHE_COORDINATOR_URL"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestCoordinatorAuthTokenIsSecret(t *testing.T) {
	const tok = "tok-very-secret-123"
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"flag": {[]string{"--coordinator-auth-token", tok}, nil},
		"env":  {nil, map[string]string{"LMCACHE_COORDINATOR_AUTH_TOKEN": tok}},
	} {
		c, err := ParseEnv(tc.args, env(tc.env), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if c.CoordinatorAuthToken != tok {
			t.Errorf("%s: CoordinatorAuthToken = %q, want %q", name, c.CoordinatorAuthToken, tok)
		}
		if got := c.Groups()[GroupCoordinator]["coordinator_auth_token"]; got != Redacted {
			t.Errorf("%s: /config shows %v, want %q", name, got, Redacted)
		}
		// --help with the secret in the environment prints the default, not the value.
		var buf bytes.Buffer
		if _, err := ParseEnv(append(tc.args, "--help"), env(tc.env), &buf); !errors.Is(err, ErrHelp) {
			t.Fatalf("%s: help err = %v", name, err)
		}
		if strings.Contains(buf.String(), tok) {
			t.Errorf("%s: --help prints the token", name)
		}
		if !strings.Contains(buf.String(), `--coordinator-auth-token`+"\n"+`      bearer token sent to the coordinator; empty: none (default ""; env LMCACHE_COORDINATOR_AUTH_TOKEN)`) {
			t.Errorf("%s: --help lacks the token flag line:\n%s", name, buf.String())
		}
	}
	c, err := ParseEnv(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CoordinatorAuthToken != "" || c.Groups()[GroupCoordinator]["coordinator_auth_token"] != "" {
		t.Errorf("default token %q shown as %v", c.CoordinatorAuthToken, c.Groups()[GroupCoordinator]["coordinator_auth_token"])
	}
}

// TestL2LookupTimeoutFlag: --l2-lookup-timeout-ms defaults to 200, falls
// back to LMCACHE_L2_LOOKUP_TIMEOUT_MS, the flag wins, 0 is allowed (no
// limit), and /config shows it in the storage_manager group.
func TestL2LookupTimeoutFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{nil, nil, 200},
		{nil, map[string]string{"LMCACHE_L2_LOOKUP_TIMEOUT_MS": "50"}, 50},
		{[]string{"--l2-lookup-timeout-ms", "0"}, map[string]string{"LMCACHE_L2_LOOKUP_TIMEOUT_MS": "50"}, 0},
	} {
		c, err := ParseEnv(tc.args, env(tc.env), nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.L2LookupTimeoutMS != tc.want || c.Groups()[GroupStorage]["l2_lookup_timeout_ms"] != tc.want {
			t.Errorf("%v %v: got %d (/config %v), want %d", tc.args, tc.env, c.L2LookupTimeoutMS, c.Groups()[GroupStorage]["l2_lookup_timeout_ms"], tc.want)
		}
	}
}

// TestCoordinatorEnvValues: the coordinator client's env variables as the
// binary reads them: fractional seconds, the advertise IP, the defaults
// when unset, and a startup error for a heartbeat or flush interval that is
// not a finite number of seconds > 0 (upstream fails its start too).
func TestCoordinatorEnvValues(t *testing.T) {
	c, err := ParseEnv(nil, env(map[string]string{
		"LMCACHE_COORDINATOR_URL":                  "http://c:9300",
		"LMCACHE_COORDINATOR_ADVERTISE_IP":         "10.0.0.1",
		"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL":   "2.5",
		"LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL": "0.25",
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CoordinatorURL != "http://c:9300" || c.CoordinatorAdvertiseIP != "10.0.0.1" ||
		c.CoordinatorHeartbeatInterval != 2.5 || c.CoordinatorEventFlushInterval != 0.25 {
		t.Fatalf("env: url %q ip %q heartbeat %v flush %v", c.CoordinatorURL, c.CoordinatorAdvertiseIP,
			c.CoordinatorHeartbeatInterval, c.CoordinatorEventFlushInterval)
	}
	def, err := ParseEnv(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if def.CoordinatorURL != "" || def.CoordinatorAdvertiseIP != "" || def.CoordinatorHeartbeatInterval != 5 ||
		def.CoordinatorEventFlushInterval != 1 || def.CoordinatorEventReporting {
		t.Fatalf("defaults: url %q ip %q heartbeat %v flush %v reporting %v", def.CoordinatorURL, def.CoordinatorAdvertiseIP,
			def.CoordinatorHeartbeatInterval, def.CoordinatorEventFlushInterval, def.CoordinatorEventReporting)
	}
	for _, name := range []string{"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL", "LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL",
		"LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL"} {
		for _, bad := range []string{"0", "-1", "nan", "inf", "x"} {
			_, err := ParseEnv(nil, env(map[string]string{name: bad}), nil)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%q: err %v, want ErrInvalid naming the variable", name, bad, err)
			}
		}
	}
}
