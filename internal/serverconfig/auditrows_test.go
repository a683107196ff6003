package serverconfig

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// mustParse parses args with no environment and fails the test on error.
func mustParse(t *testing.T, args ...string) *Config {
	t.Helper()
	c, err := ParseEnv(args, env(nil), nil)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return c
}

// oneLineInvalid asserts args are refused with ErrInvalid (cmd/lmcache's
// runServer turns any Parse error into one stderr line and exit 2) and that
// the one line contains want.
func oneLineInvalid(t *testing.T, want string, args ...string) {
	t.Helper()
	_, err := ParseEnv(args, env(nil), nil)
	if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), want) {
		t.Errorf("%v: err = %v, want one line containing %q", args, err, want)
	}
}

// TestMPGroupFlagsParsed: each mp-group flag of the row is parsed into its
// field; --engine-type blend and --transport grpc are refused.
func TestMPGroupFlagsParsed(t *testing.T) {
	c := mustParse(t, "--host", "0.0.0.0", "--port", "6000", "--chunk-size", "16", "--hash-algorithm", "sha256_cbor",
		"--engine-type", "default", "--supported-transfer-mode", "engine_driven", "--shm-name", "pool1",
		"--instance-id", "inst-7", "--max-workers", "3", "--script-allowed-imports", "math", "json",
		"--run-script-api-enabled", "--worker-reap-timeout-seconds", "45", "--worker-registration-grace-seconds", "90",
		"--separate-object-groups", "--transport", "zmq")
	if c.Host != "0.0.0.0" || c.Port != 6000 || c.ChunkSize != 16 || c.HashAlgorithm != "sha256_cbor" ||
		c.EngineType != "default" || c.SupportedTransferMode != "engine_driven" || c.SHMName != "pool1" ||
		c.InstanceID != "inst-7" || c.MaxWorkers != 3 || !reflect.DeepEqual(c.ScriptAllowedImports, []string{"math", "json"}) ||
		!c.RunScriptAPIEnabled || c.WorkerReapTimeoutSeconds != 45 || c.WorkerRegistrationGrace != 90 ||
		!c.SeparateObjectGroups || c.Transport != "zmq" {
		t.Fatalf("parsed %+v", c)
	}
	if c := mustParse(t, "--separate-object-groups", "--no-separate-object-groups"); c.SeparateObjectGroups {
		t.Error("--no-separate-object-groups after --separate-object-groups left it true")
	}
	d := mustParse(t)
	if d.EngineType != "default" || d.Transport != "zmq" || d.SeparateObjectGroups || d.MaxWorkers != 1 ||
		d.SupportedTransferMode != "auto" || d.WorkerReapTimeoutSeconds != 120 || d.WorkerRegistrationGrace != 3600 {
		t.Errorf("defaults %+v", d)
	}
	oneLineInvalid(t, `--engine-type: must be one of default (got "blend")`, "--engine-type", "blend")
	oneLineInvalid(t, `--transport: must be one of zmq (got "grpc")`, "--transport", "grpc")
}

// TestTwelveNewFlags: the twelve flags of the "new flags" row, each parsed,
// its default as a literal, and one invalid value refused with the flag named.
func TestTwelveNewFlags(t *testing.T) {
	d := mustParse(t)
	cases := []struct {
		flag    string
		args    []string
		parsed  func(*Config) bool
		isDef   func(*Config) bool
		invalid []string // nil: the flag takes any value
		want    string
	}{
		{"--wire-profile", []string{"--wire-profile", "gen3"}, func(c *Config) bool { return c.WireProfile == "gen3" },
			func(c *Config) bool { return c.WireProfile == "auto" }, []string{"--wire-profile", "gen9"}, `--wire-profile: must be one of auto, gen2m, gen3 (got "gen9")`},
		{"--hash-root-hex", []string{"--hash-root-hex", "00ff"}, func(c *Config) bool { return c.HashRootHex == "00ff" },
			func(c *Config) bool { return c.HashRootHex == "" }, []string{"--hash-root-hex", "zz"}, `--hash-root-hex: must be hex (got "zz")`},
		{"--http-auth-token", []string{"--http-auth-token", "s3cret"}, func(c *Config) bool { return c.HTTPAuthToken == "s3cret" },
			func(c *Config) bool { return c.HTTPAuthToken == "" }, nil, ""},
		{"--register-model", []string{"--register-model", `{"a":1}`, "--register-model", `{"b":2}`},
			func(c *Config) bool { return reflect.DeepEqual(c.RegisterModel, []string{`{"a":1}`, `{"b":2}`}) },
			func(c *Config) bool { return len(c.RegisterModel) == 0 }, nil, ""},
		{"--log-format", []string{"--log-format", "json"}, func(c *Config) bool { return c.LogFormat == "json" },
			func(c *Config) bool { return c.LogFormat == "text" }, []string{"--log-format", "xml"}, `--log-format: must be one of`},
		{"--log-level", []string{"--log-level", "debug"}, func(c *Config) bool { return c.LogLevel == "DEBUG" },
			func(c *Config) bool { return c.LogLevel == "INFO" }, []string{"--log-level", "loud"}, `--log-level: must be one of`},
		{"--shm-mode", []string{"--shm-mode", "0660"}, func(c *Config) bool { b, err := c.SHMModeBits(); return err == nil && b == 0o660 },
			func(c *Config) bool {
				b, err := c.SHMModeBits()
				return c.SHMMode == "0600" && err == nil && b == 0o600
			}, []string{"--shm-mode", "999"}, "--shm-mode:"},
		{"--session-ttl-seconds", []string{"--session-ttl-seconds", "30"}, func(c *Config) bool { return c.SessionTTLSeconds == 30 },
			func(c *Config) bool { return c.SessionTTLSeconds == 600 }, []string{"--session-ttl-seconds", "0"}, "--session-ttl-seconds: must be finite and > 0 (got 0)"},
		{"--env-show-secrets", []string{"--env-show-secrets"}, func(c *Config) bool { return c.EnvShowSecret },
			func(c *Config) bool { return !c.EnvShowSecret }, []string{"--env-show-secrets=maybe"}, "--env-show-secrets"},
		{"--l2-store-max-retries", []string{"--l2-store-max-retries", "2"}, func(c *Config) bool { return c.L2StoreMaxRetries == 2 },
			func(c *Config) bool { return c.L2StoreMaxRetries == 5 }, []string{"--l2-store-max-retries", "-1"}, "--l2-store-max-retries: must be >= 0 (got -1)"},
		{"--l2-store-retry-backoff-seconds", []string{"--l2-store-retry-backoff-seconds", "0.5"}, func(c *Config) bool { return c.L2StoreRetryBackoffSecs == 0.5 },
			func(c *Config) bool { return c.L2StoreRetryBackoffSecs == 1 }, []string{"--l2-store-retry-backoff-seconds", "0"}, "--l2-store-retry-backoff-seconds: must be finite and > 0 (got 0)"},
		{"--max-queued-requests", []string{"--max-queued-requests", "7"}, func(c *Config) bool { return c.MaxQueuedRequests == 7 },
			func(c *Config) bool { return c.MaxQueuedRequests == 4096 }, []string{"--max-queued-requests", "0"}, "--max-queued-requests: must be >= 1 (got 0)"},
	}
	if len(cases) != 12 {
		t.Fatalf("%d cases, want the twelve", len(cases))
	}
	for _, tc := range cases {
		if !tc.isDef(d) {
			t.Errorf("%s: default not the documented literal: %+v", tc.flag, d)
		}
		if c := mustParse(t, tc.args...); !tc.parsed(c) {
			t.Errorf("%s: %v not parsed: %+v", tc.flag, tc.args, c)
		}
		if tc.invalid != nil {
			oneLineInvalid(t, tc.want, tc.invalid...)
		}
	}
	// The environment forms the row names.
	c, err := ParseEnv(nil, env(map[string]string{"LMCACHE_HASH_ROOT_HEX": "ab", "LMCACHE_HTTP_AUTH_TOKEN": "tok"}), nil)
	if err != nil || c.HashRootHex != "ab" || c.HTTPAuthToken != "tok" {
		t.Fatalf("env: %v %q %q", err, c.HashRootHex, c.HTTPAuthToken)
	}
}

// TestStorageGroupFlagsParsed: each storage_manager flag of the row parsed.
func TestStorageGroupFlagsParsed(t *testing.T) {
	c := mustParse(t, "--l1-size-gb", "2", "--no-l1-use-lazy", "--l1-init-size-gb", "1", "--l1-align-bytes", "8192",
		"--l1-use-hugepages", "--l1-read-ttl-seconds", "11", "--l1-write-ttl-seconds", "22", "--eviction-policy", "noop",
		"--eviction-trigger-watermark", "0.5", "--eviction-ratio", "0.3", "--l2-store-policy", "skip_l1",
		"--l2-prefetch-policy", "retain", "--l2-prefetch-max-in-flight", "4", "--l2-prefetch-load-timeout", "2.5",
		"--periodic-notifier-interval-ms", "9", "--l2-adapter", `{"type":"fs","base_path":"/tmp/x"}`)
	if c.L1SizeGB != 2 || c.L1UseLazy || c.L1InitSizeGB != 1 || c.L1AlignBytes != 8192 || !c.L1UseHugepages ||
		c.L1ReadTTLSeconds != 11 || c.L1WriteTTLSeconds != 22 || c.EvictionPolicy != "noop" || c.EvictionWatermark != 0.5 ||
		c.EvictionRatio != 0.3 || c.L2StorePolicy != "skip_l1" || c.L2PrefetchPolicy != "retain" || c.L2PrefetchMaxInFlight != 4 ||
		c.L2PrefetchLoadTimeout != 2.5 || c.PeriodicNotifierMS != 9 ||
		!reflect.DeepEqual(c.L2Adapters, []string{`{"type":"fs","base_path":"/tmp/x"}`}) {
		t.Fatalf("parsed %+v", c)
	}
}

// TestObservabilityFlagsParsedChangeNoOtherSetting: --disable-*,
// --metrics-sample-rate and --prometheus-port are parsed, and setting them
// leaves every other field of Config at its default. Outside serverconfig
// only cmd/lmcache's startTracing reads one of them
// (--disable-observability turns tracing off); that is not tested here.
func TestObservabilityFlagsParsedChangeNoOtherSetting(t *testing.T) {
	c := mustParse(t, "--disable-observability", "--disable-metrics", "--disable-logging",
		"--metrics-sample-rate", "0.5", "--prometheus-port", "9191")
	if !c.DisableObservability || !c.DisableMetrics || !c.DisableLogging || c.MetricsSampleRate != 0.5 || c.PrometheusPort != 9191 {
		t.Fatalf("parsed %+v", c)
	}
	d := mustParse(t)
	if d.DisableObservability || d.DisableMetrics || d.DisableLogging || d.MetricsSampleRate != 0.01 || d.PrometheusPort != 9090 {
		t.Fatalf("defaults %+v", d)
	}
	c.DisableObservability, c.DisableMetrics, c.DisableLogging, c.MetricsSampleRate, c.PrometheusPort = false, false, false, 0.01, 9090
	c.reg, d.reg = nil, nil
	if !reflect.DeepEqual(c, d) {
		t.Errorf("other settings changed:\n got %+v\nwant %+v", c, d)
	}
	oneLineInvalid(t, "--metrics-sample-rate: must satisfy 0 <= x <= 1 (got 2)", "--metrics-sample-rate", "2")
}

// TestEventReportingEnvTruthy: the binary reads
// LMCACHE_COORDINATOR_EVENT_REPORTING (and the older _L2_ name) with
// upstream's truth test: 1, true and yes in any case are on; anything
// else, "on" and an empty value included, is off and no error (upstream
// compares the lowered value with those three).
func TestEventReportingEnvTruthy(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "true": true, "YES": true, " yes ": true,
		"on": false, "": false, "maybe": false, "0": false, "false": false} {
		for _, name := range []string{"LMCACHE_COORDINATOR_EVENT_REPORTING", "LMCACHE_COORDINATOR_L2_EVENT_REPORTING"} {
			c, err := ParseEnv(nil, env(map[string]string{name: v}), nil)
			if err != nil || c.CoordinatorEventReporting != want {
				t.Errorf("%s=%q: reporting %v, %v; want %v and no error", name, v, c != nil && c.CoordinatorEventReporting, err, want)
			}
		}
	}
	// The newer name wins over the older one.
	c, err := ParseEnv(nil, env(map[string]string{"LMCACHE_COORDINATOR_EVENT_REPORTING": "no", "LMCACHE_COORDINATOR_L2_EVENT_REPORTING": "1"}), nil)
	if err != nil || c.CoordinatorEventReporting {
		t.Errorf("new name no, old name 1: reporting %v, %v; want false", c != nil && c.CoordinatorEventReporting, err)
	}
	// The flag is a plain switch.
	if c, err := ParseEnv([]string{"--coordinator-event-reporting"}, env(nil), nil); err != nil || !c.CoordinatorEventReporting {
		t.Errorf("--coordinator-event-reporting: %v, %v", c != nil && c.CoordinatorEventReporting, err)
	}
}
