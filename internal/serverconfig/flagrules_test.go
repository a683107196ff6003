package serverconfig

import (
	"errors"
	"strings"
	"testing"
)

// parseErr parses args with e and returns the error text ("" when none),
// failing when an error is not ErrInvalid or spans lines.
func parseErr(t *testing.T, args []string, e map[string]string) string {
	t.Helper()
	_, err := ParseEnv(args, env(e), nil)
	if err == nil {
		return ""
	}
	if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("%v %v: %v is not one ErrInvalid line", args, e, err)
	}
	return err.Error()
}

// TestShmNameRule: --shm-name is checked at flag time against what the
// engine makes of it (a leading "/" dropped, lmcache_l1_pool_ added): one
// path component of at most NAME_MAX (255) bytes with the prefix.
func TestShmNameRule(t *testing.T) {
	for _, ok := range []string{"", "a", "/a", "lmcache_l1_pool_a", strings.Repeat("x", 255-len("lmcache_l1_pool_"))} {
		if got := parseErr(t, []string{"--shm-name", ok}, nil); got != "" {
			t.Errorf("--shm-name %q refused: %s", ok, got)
		}
	}
	for name, want := range map[string]string{
		"a/b":                        `--shm-name: must be one name without "/" (a leading one is dropped) (got "a/b")`,
		"/":                          `--shm-name: must name a shared-memory segment, not only slashes (got "/")`,
		"a\x00b":                     `--shm-name: must not contain a NUL byte (got "a\x00b")`,
		strings.Repeat("x", 255-15):  `--shm-name: must be at most 255 bytes with the lmcache_l1_pool_ prefix (got 256)`,
		"lmcache_l1_pool_" + "x/../": `--shm-name: must be one name without "/" (a leading one is dropped) (got "lmcache_l1_pool_x/../")`,
	} {
		if got := parseErr(t, []string{"--shm-name", name}, nil); got != want {
			t.Errorf("--shm-name %q:\n got %s\nwant %s", name, got, want)
		}
	}
	// The config file is checked by the same rule, naming the file.
	if got := parseErr(t, nil, map[string]string{EnvConfigFile: configFile(t, "shm_name: a/b\n")}); !strings.HasPrefix(got, "--shm-name: ") || !strings.HasSuffix(got, ` line 1: must be one name without "/" (a leading one is dropped) (got "a/b")`) {
		t.Errorf("file: %s", got)
	}
}

// TestProtectMetricsFlag: LMCACHE_HTTP_AUTH_PROTECT_METRICS is a setting of
// the flag table (--http-auth-protect-metrics): "1" keeps working, the
// layer's booleans are accepted, anything else is one error, and GET
// /config reports the value and its source.
func TestProtectMetricsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string // "" = unset
		want bool
		src  string
	}{
		{nil, "", false, "default"},
		{nil, "1", true, "env:LMCACHE_HTTP_AUTH_PROTECT_METRICS"},
		{nil, "true", true, "env:LMCACHE_HTTP_AUTH_PROTECT_METRICS"},
		{nil, "0", false, "env:LMCACHE_HTTP_AUTH_PROTECT_METRICS"},
		{[]string{"--http-auth-protect-metrics"}, "", true, "flag:--http-auth-protect-metrics"},
		{[]string{"--http-auth-protect-metrics=false"}, "1", false, "flag:--http-auth-protect-metrics"},
	} {
		e := map[string]string{}
		if tc.env != "" {
			e[EnvProtectMetrics] = tc.env
		}
		c, err := ParseEnv(tc.args, env(e), nil)
		if err != nil {
			t.Fatalf("%v %q: %v", tc.args, tc.env, err)
		}
		if c.HTTPAuthProtectMetrics != tc.want || c.Groups()[GroupHTTP]["http_auth_protect_metrics"] != tc.want || c.Sources()[GroupHTTP]["http_auth_protect_metrics"] != tc.src {
			t.Errorf("%v %q: %v (/config %v from %q), want %v from %q", tc.args, tc.env, c.HTTPAuthProtectMetrics,
				c.Groups()[GroupHTTP]["http_auth_protect_metrics"], c.Sources()[GroupHTTP]["http_auth_protect_metrics"], tc.want, tc.src)
		}
	}
	want := `--http-auth-protect-metrics: LMCACHE_HTTP_AUTH_PROTECT_METRICS: not a boolean (got "maybe")`
	if got := parseErr(t, nil, map[string]string{EnvProtectMetrics: "maybe"}); got != want {
		t.Errorf("maybe:\n got %s\nwant %s", got, want)
	}
}

// TestPortRule: both ports of the server give cliflag's one port reason,
// the coordinator's too (internal/coordinator/config TestInvalidValues).
func TestPortRule(t *testing.T) {
	for args, want := range map[string]string{
		"--port 70000":     "--port: must be a port number 0-65535 (got 70000)",
		"--http-port -1":   "--http-port: must be a port number 0-65535 (got -1)",
		"-http-port 65536": "--http-port: must be a port number 0-65535 (got 65536)",
	} {
		if got := parseErr(t, strings.Fields(args), nil); got != want {
			t.Errorf("%s:\n got %s\nwant %s", args, got, want)
		}
	}
}

// TestSingleDashFlags: Go's "-chunk-size 1" is accepted like "--chunk-size
// 1", and its errors name the flag with two dashes.
func TestSingleDashFlags(t *testing.T) {
	c, err := ParseEnv([]string{"-chunk-size", "1"}, env(nil), nil)
	if err != nil || c.ChunkSize != 1 || c.Sources()[GroupMP]["chunk_size"] != "flag:--chunk-size" {
		t.Fatalf("-chunk-size 1: %v %+v", err, c)
	}
	for args, want := range map[string]string{
		"-chunk-size x":     `--chunk-size: not an integer (got "x")`,
		"-chunk-size 0":     `--chunk-size: must be >= 1 (got 0)`,
		"-no-such-flag":     `--no-such-flag: flag provided but not defined`,
		"-l1-use-lazy=nope": `--l1-use-lazy: not a boolean (got "nope")`,
	} {
		if got := parseErr(t, strings.Fields(args), nil); got != want {
			t.Errorf("%s:\n got %s\nwant %s", args, got, want)
		}
	}
}

// TestUnsupportedUpstreamFlagsRejected: upstream flags of features this
// server does not have are unknown flags (one line each), not silently
// accepted. The P2P and lookup-hash-log names are representative of
// upstream's --p2p-* and --lookup-hash-log-* families.
func TestUnsupportedUpstreamFlagsRejected(t *testing.T) {
	for _, args := range [][]string{
		// Upstream's P2P flags (its RDMA variant adds --p2p-rdma-*) and
		// lookup-hash log flags, as its MP server defines them.
		{"--p2p-advertise-url", "tcp://10.0.0.1:8200"}, {"--p2p-listen-url", "tcp://0.0.0.0:8200"},
		{"--p2p-lookup-timeout", "30"}, {"--p2p-load-timeout", "30"}, {"--p2p-transfer-engine", "nixl"},
		{"--p2p-rdma-device", "mlx5_0"}, {"--p2p-rdma-port", "1"},
		{"--lookup-hash-log-dir", "/tmp/x"}, {"--lookup-hash-log-rotation-interval", "21600"},
		{"--lookup-hash-log-rotation-max-size", "104857600"}, {"--lookup-hash-log-max-files", "100"},
		{"--l1-manager", "x"}, {"--l1-devdax-path", "/dev/dax0.0"}, {"--gds-l1-path", "/mnt/x"},
		{"--gds-l1-backend", "cufile"}, {"--gds-l1-use-direct-io"},
	} {
		want := args[0] + ": flag provided but not defined"
		if got := parseErr(t, args, nil); got != want {
			t.Errorf("%v:\n got %s\nwant %s", args, got, want)
		}
	}
}

// TestL1LazyFlagsAccepted: --l1-use-lazy / --no-l1-use-lazy (default true)
// and --l1-init-size-gb (default 20) parse as upstream's; that they change
// nothing the engine is given is cmd/lmcache TestL1LazyFlagsHaveNoEffect.
func TestL1LazyFlagsAccepted(t *testing.T) {
	c, err := ParseEnv(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.L1UseLazy || c.L1InitSizeGB != 20 {
		t.Fatalf("defaults: lazy %v, init %v; want true, 20", c.L1UseLazy, c.L1InitSizeGB)
	}
	for _, tc := range []struct {
		args []string
		lazy bool
		init float64
	}{
		{[]string{"--l1-use-lazy"}, true, 20},
		{[]string{"--no-l1-use-lazy"}, false, 20},
		{[]string{"--no-l1-use-lazy", "--l1-init-size-gb", "5"}, false, 5},
		{[]string{"--l1-init-size-gb", "0.5"}, true, 0.5},
	} {
		c, err := ParseEnv(tc.args, env(nil), nil)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.L1UseLazy != tc.lazy || c.L1InitSizeGB != tc.init {
			t.Errorf("%v: lazy %v, init %v; want %v, %v", tc.args, c.L1UseLazy, c.L1InitSizeGB, tc.lazy, tc.init)
		}
	}
}

// TestDurationAndSizeBounds: every seconds, milliseconds, microseconds and
// GiB flag the server converts into a time.Duration or an int64 byte count
// is refused at flag time when the conversion would not hold it: past
// about 292 years a float-to-Duration conversion gives math.MinInt64 (a
// session TTL of 1e10 s expired every session on the next sweep), an
// integer product wraps, and a value under a nanosecond truncates to 0,
// which consumers read as "the default". NaN and +Inf grace periods were
// accepted because NaN < x and +Inf < x are both false.
func TestDurationAndSizeBounds(t *testing.T) {
	for _, tc := range []struct {
		flag, val, want string
	}{
		{"--session-ttl-seconds", "1e10", "--session-ttl-seconds: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e+10)"},
		{"--session-ttl-seconds", "1e-12", "--session-ttl-seconds: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e-12)"},
		{"--l1-read-ttl-seconds", "1e300", "--l1-read-ttl-seconds: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e+300)"},
		{"--l1-write-ttl-seconds", "9.3e9", "--l1-write-ttl-seconds: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 9.3e+09)"},
		{"--l2-store-retry-backoff-seconds", "1e10", "--l2-store-retry-backoff-seconds: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e+10)"},
		{"--l2-prefetch-load-timeout", "1e10", "--l2-prefetch-load-timeout: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e+10)"},
		{"--coordinator-heartbeat-interval", "1e-10", "--coordinator-heartbeat-interval: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e-10)"},
		{"--coordinator-event-flush-interval", "1e10", "--coordinator-event-flush-interval: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e+10)"},
		{"--coordinator-kafka-delivery-timeout", "1e10", "--coordinator-kafka-delivery-timeout: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e+10)"},
		{"--worker-reap-timeout-seconds", "1e10", "--worker-reap-timeout-seconds: must be between 1e-09 and 9.223e+09 seconds, a time.Duration (got 1e+10)"},
		{"--worker-registration-grace-seconds", "NaN", "--worker-registration-grace-seconds: must be finite and >= 0 (got NaN)"},
		{"--worker-registration-grace-seconds", "+Inf", "--worker-registration-grace-seconds: must be finite and >= 0 (got +Inf)"},
		{"--l2-lookup-timeout-ms", "9223372036855", "--l2-lookup-timeout-ms: must be <= 9223372036854 milliseconds, a time.Duration (got 9223372036855)"},
		{"--zmq-busy-poll-us", "9223372036854776", "--zmq-busy-poll-us: must be <= 9223372036854775 microseconds, a time.Duration (got 9223372036854776)"},
		{"--l2-store-max-retries", "9223372036854775807", "--l2-store-max-retries: must be <= 2147483647 (got 9223372036854775807)"},
		{"--gc-heap-floor-mb", "8796093022208", "--gc-heap-floor-mb: must be <= 8796093022207 (got 8796093022208)"},
		{"--l1-init-size-gb", "1e10", "--l1-init-size-gb: must be < 8589934592 GiB, an int64 byte count (got 1e+10)"},
		{"--l1-size-gb", "8589934592", "--l1-size-gb: must be < 8589934592 GiB, an int64 byte count (got 8.589934592e+09)"},
	} {
		if got := parseErr(t, []string{tc.flag, tc.val}, nil); got != tc.want {
			t.Errorf("%s %s:\n got %q\nwant %q", tc.flag, tc.val, got, tc.want)
		}
	}
	// The largest values that still convert, and the zeros that mean
	// "none", are accepted.
	for _, args := range [][]string{
		{"--session-ttl-seconds", "9.2e9"}, {"--session-ttl-seconds", "1e-9"},
		{"--l2-prefetch-load-timeout", "0"}, {"--worker-reap-timeout-seconds", "0", "--worker-registration-grace-seconds", "0"},
		{"--worker-registration-grace-seconds", "9.2e9"},
		{"--l2-lookup-timeout-ms", "9223372036854"}, {"--zmq-busy-poll-us", "9223372036854775"},
		{"--l2-store-max-retries", "2147483647"}, {"--gc-heap-floor-mb", "8796093022207"},
		{"--l1-size-gb", "8589934591", "--l1-init-size-gb", "8589934591"},
	} {
		if got := parseErr(t, args, nil); got != "" {
			t.Errorf("%v refused: %s", args, got)
		}
	}
	c, err := ParseEnv([]string{"--l1-size-gb", "8589934591", "--l1-init-size-gb", "8589934591"}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.L1SizeBytes() <= 0 || c.L1InitSizeBytes() != c.L1SizeBytes() {
		t.Errorf("L1SizeBytes %d, L1InitSizeBytes %d: want positive and equal", c.L1SizeBytes(), c.L1InitSizeBytes())
	}
}

// TestPreallocatedSizesBounded: the flags whose value the server allocates
// at start (the KV event log's ring, the publisher's queue) stop at 2^22
// entries with a flag error; a larger value panicked (makeslice) or
// exhausted memory before the server started. 2^22 itself is accepted.
func TestPreallocatedSizesBounded(t *testing.T) {
	for _, flag := range []string{"--kv-event-log-size", "--kv-events-max-queue-size"} {
		want := flag + ": must be <= 4194304 (got 4194305)"
		if got := parseErr(t, []string{flag, "4194305"}, nil); got != want {
			t.Errorf("%s 4194305:\n got %q\nwant %q", flag, got, want)
		}
		if got := parseErr(t, []string{flag, "4194304"}, nil); got != "" {
			t.Errorf("%s 4194304 refused: %s", flag, got)
		}
	}
}

// TestHTTPKVBodyBudgetFlag: --http-kv-body-budget-mb (env
// LMCACHE_HTTP_KV_BODY_BUDGET_MB) defaults to 2048 MiB, is reported in
// GET /config's http group, converts to bytes, and must be in
// [1, MaxInt64>>20] so the byte count fits an int64.
func TestHTTPKVBodyBudgetFlag(t *testing.T) {
	c, err := ParseEnv(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPKVBodyBudgetMB != 2048 || c.HTTPKVBodyBudgetBytes() != 2<<30 || c.Groups()[GroupHTTP]["http_kv_body_budget_mb"] != 2048 {
		t.Fatalf("default = %d MiB (%d bytes), /config %v", c.HTTPKVBodyBudgetMB, c.HTTPKVBodyBudgetBytes(), c.Groups()[GroupHTTP]["http_kv_body_budget_mb"])
	}
	c, err = ParseEnv([]string{"--http-kv-body-budget-mb", "64"}, env(map[string]string{"LMCACHE_HTTP_KV_BODY_BUDGET_MB": "32"}), nil)
	if err != nil || c.HTTPKVBodyBudgetBytes() != 64<<20 {
		t.Fatalf("flag over env: %v %v", c, err)
	}
	c, err = ParseEnv(nil, env(map[string]string{"LMCACHE_HTTP_KV_BODY_BUDGET_MB": "32"}), nil)
	if err != nil || c.HTTPKVBodyBudgetBytes() != 32<<20 {
		t.Fatalf("env: %v %v", c, err)
	}
	for _, v := range []string{"0", "-1", "8796093022208"} {
		if got := parseErr(t, []string{"--http-kv-body-budget-mb", v}, nil); !strings.HasPrefix(got, "--http-kv-body-budget-mb: must be") {
			t.Errorf("--http-kv-body-budget-mb %s: %q", v, got)
		}
	}
}

// TestHTTPKVMaxBodyFlag: --http-kv-max-body-mb (env
// LMCACHE_HTTP_KV_MAX_BODY_MB) defaults to 1024 MiB, is reported in GET
// /config's http group, converts to bytes, must be in [1, MaxInt64>>20],
// and may not exceed --http-kv-body-budget-mb (a store of the maximum
// size would never fit the budget); unset, it is the budget when that is
// smaller.
func TestHTTPKVMaxBodyFlag(t *testing.T) {
	c, err := ParseEnv(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPKVMaxBodyMB != 1024 || c.HTTPKVMaxBodyBytes() != 1<<30 || c.Groups()[GroupHTTP]["http_kv_max_body_mb"] != 1024 {
		t.Fatalf("default = %d MiB (%d bytes), /config %v", c.HTTPKVMaxBodyMB, c.HTTPKVMaxBodyBytes(), c.Groups()[GroupHTTP]["http_kv_max_body_mb"])
	}
	c, err = ParseEnv([]string{"--http-kv-max-body-mb", "4096", "--http-kv-body-budget-mb", "8192"}, env(nil), nil)
	if err != nil || c.HTTPKVMaxBodyBytes() != 4<<30 {
		t.Fatalf("4096 under an 8192 budget: %v %v", c, err)
	}
	c, err = ParseEnv(nil, env(map[string]string{"LMCACHE_HTTP_KV_MAX_BODY_MB": "32"}), nil)
	if err != nil || c.HTTPKVMaxBodyBytes() != 32<<20 {
		t.Fatalf("env: %v %v", c, err)
	}
	for _, v := range []string{"0", "-1", "8796093022208"} {
		if got := parseErr(t, []string{"--http-kv-max-body-mb", v}, nil); !strings.HasPrefix(got, "--http-kv-max-body-mb: must be") {
			t.Errorf("--http-kv-max-body-mb %s: %q", v, got)
		}
	}
	c, err = ParseEnv([]string{"--http-kv-body-budget-mb", "64"}, env(nil), nil)
	if err != nil || c.HTTPKVMaxBodyMB != 64 || c.Groups()[GroupHTTP]["http_kv_max_body_mb"] != 64 {
		t.Fatalf("unset under a 64 MiB budget: %v %v, want 64", c, err)
	}
	if got, want := parseErr(t, []string{"--http-kv-max-body-mb", "4096"}, nil), "--http-kv-max-body-mb: must be <= --http-kv-body-budget-mb (2048), which every store body must fit (got 4096)"; got != want {
		t.Errorf("over the budget: %q, want %q", got, want)
	}
}
