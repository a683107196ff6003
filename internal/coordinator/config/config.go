// Package config holds the coordinator's settings: defaults, a YAML config
// file, the LMCACHE_MP_COORDINATOR_* environment variables and the CLI
// flags, applied in that order of increasing precedence by the flag layer
// the server shares (internal/cliflag), then validated as a whole.
package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/cliflag"
	"github.com/lmcache-go/lmcache/internal/loglevel"
	"github.com/lmcache-go/lmcache/internal/redact"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// EnvPrefix prefixes every environment variable the coordinator reads.
const EnvPrefix = "LMCACHE_MP_COORDINATOR_"

// MaxResyncPageSize is the MP server's ceiling for GET /cache/objects
// page_size; larger configured values are clamped to it.
const MaxResyncPageSize = 5000

// ErrHelp is returned by Load when --help was requested.
var ErrHelp = cliflag.ErrHelp

// ErrInvalid is matched by every configuration error; the errors
// themselves read "--<flag>: <reason>" (cliflag.Error).
var ErrInvalid = cliflag.ErrInvalid

// Config is the complete coordinator configuration. Durations are kept as
// seconds (float64) like upstream, with helpers that convert.
type Config struct {
	Host                  string
	Port                  int
	InstanceTimeout       float64
	HealthCheckInterval   float64
	EvictionCheckInterval float64
	EvictionRatio         float64
	TriggerWatermark      float64
	ChunkSize             int
	HashAlgorithm         string
	HashRootHex           string // ours: the MP servers' --hash-root-hex
	BlendProbeStride      int
	TimeoutKeepAlive      int
	EnableStartupResync   bool
	ResyncPollInterval    float64
	ResyncMaxWait         float64
	ResyncPageSize        int

	// Beyond upstream.

	// StateFile, when set, persists quotas, the default limit and pins.
	StateFile string
	// MetricsTopSalts bounds the per-salt metric series to the N salts with
	// the most tracked bytes; 0 disables per-salt series.
	MetricsTopSalts int
	// InflightTTL is how long dispatched eviction victims are withheld from
	// later plans while their delete events are awaited.
	InflightTTL float64
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// LogFormat is text, json or upstream (--log-format, LMCACHE_LOG_FORMAT,
	// as the server's).
	LogFormat string
	// AuthToken, when set, is the bearer token every mutating route and
	// event ingest require. Never logged or echoed.
	AuthToken string
	// MPAuthToken, when set, is sent as a bearer token on every call to the
	// MP servers (eviction DELETEs, resync listing, prefetch relay), whose
	// --http-auth-token protects those routes. Never logged or echoed.
	MPAuthToken string
	// HA is active/standby on etcd (ha.go); off by default.
	HA HA
	// Ingest is the event transport and the checkpoint (ingest.go).
	Ingest Ingest
	// Tracing is OTLP span export of the HTTP routes (tracing.go).
	Tracing Tracing

	// Sources says where each setting came from, keyed as View keys it
	// ("chunk_size": "flag:--chunk-size"); LoadSources fills it, and it is
	// nil for a Config built in code.
	Sources map[string]string
}

// Default returns the documented defaults.
func Default() Config {
	return Config{
		Host:                  "0.0.0.0",
		Port:                  9300,
		InstanceTimeout:       30,
		HealthCheckInterval:   10,
		EvictionCheckInterval: 5,
		EvictionRatio:         0.2,
		TriggerWatermark:      1.0,
		ChunkSize:             256,
		HashAlgorithm:         tokenhash.Blake3,
		BlendProbeStride:      1,
		TimeoutKeepAlive:      10,
		EnableStartupResync:   true,
		ResyncPollInterval:    1,
		ResyncMaxWait:         60,
		ResyncPageSize:        1000,
		MetricsTopSalts:       20,
		InflightTTL:           30,
		LogLevel:              "info",
		LogFormat:             "text",
		HA:                    DefaultHA(),
		Ingest:                DefaultIngest(),
		Tracing:               DefaultTracing(),
	}
}

// Seconds converts a seconds setting into a time.Duration.
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Addr is the listen address host:port.
func (c Config) Addr() string {
	h := c.Host
	if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(c.Port)
}

// field describes one setting: its flag (empty when env-only), env suffix,
// help text and how to parse and check it. Every setting lives in this one
// table so flags, env vars, help and validation cannot drift apart.
type field struct {
	flag string
	env  string
	// noEnv: a CLI-only setting (the config file key is the flag's name in
	// snake_case), as newer upstream's coordinator flags are.
	noEnv bool
	// fullEnv is a variable outside EnvPrefix that the server reads too
	// (LMCACHE_LOG_FORMAT), so one variable sets both processes; the config
	// file key is then the flag's name in snake_case.
	fullEnv string
	usage   string
	// kind is "float", "int", "string", "secret" (a string never printed),
	// "bool" (upstream's lenient environment boolean) or "switch" (a bare
	// --flag is true; text must be a boolean).
	kind  string
	f     func(*Config) *float64
	i     func(*Config) *int
	s     func(*Config) *string
	b     func(*Config) *bool
	check func(Config) string // "" when valid, else the rule broken
	// validate, where set instead of check, is a rule shared with the
	// server (cliflag.Port) whose error is the reason as it stands.
	validate func(Config) error
}

// envVar is the setting's environment variable, "" for a CLI-only one.
func (fd field) envVar() string {
	switch {
	case fd.fullEnv != "":
		return fd.fullEnv
	case fd.noEnv:
		return ""
	}
	return EnvPrefix + fd.env
}

// key is the setting's config-file and GET /config key: the variable's
// suffix in lower case, or the flag's name in snake_case for a setting
// without an LMCACHE_MP_COORDINATOR_ variable.
func (fd field) key() string {
	if fd.noEnv || fd.fullEnv != "" {
		return strings.ReplaceAll(fd.flag, "-", "_")
	}
	return strings.ToLower(fd.env)
}

func fieldsTable() []field {
	return append([]field{
		{flag: "host", env: "HOST", kind: "string", usage: "host the HTTP server binds to", s: func(c *Config) *string { return &c.Host }},
		{flag: "port", env: "PORT", kind: "int", usage: "port the HTTP server binds to", i: func(c *Config) *int { return &c.Port },
			validate: func(c Config) error { return cliflag.Port(c.Port) }},
		{flag: "instance-timeout", env: "INSTANCE_TIMEOUT", kind: "float", usage: "seconds without a heartbeat after which a server is dropped", f: func(c *Config) *float64 { return &c.InstanceTimeout },
			check: func(c Config) string { return gt0(c.InstanceTimeout) }},
		{flag: "health-check-interval", env: "HEALTH_CHECK_INTERVAL", kind: "float", usage: "seconds between health-check sweeps (0 disables the sweep)", f: func(c *Config) *float64 { return &c.HealthCheckInterval },
			check: func(c Config) string { return ge0(c.HealthCheckInterval) }},
		{flag: "eviction-check-interval", env: "EVICTION_CHECK_INTERVAL", kind: "float", usage: "seconds between L2 eviction sweeps (0 disables the loop)", f: func(c *Config) *float64 { return &c.EvictionCheckInterval },
			check: func(c Config) string { return ge0(c.EvictionCheckInterval) }},
		{flag: "eviction-ratio", env: "EVICTION_RATIO", kind: "float", usage: "fraction of tracked keys (by count) to evict per cycle, 0.0 to 1.0", f: func(c *Config) *float64 { return &c.EvictionRatio },
			check: func(c Config) string {
				if !finite(c.EvictionRatio) || c.EvictionRatio < 0 || c.EvictionRatio > 1 {
					return "must be between 0.0 and 1.0 inclusive"
				}
				return ""
			}},
		{flag: "trigger-watermark", env: "TRIGGER_WATERMARK", kind: "float", usage: "eviction fires when usage reaches this fraction of the quota, (0.0, 1.0]", f: func(c *Config) *float64 { return &c.TriggerWatermark },
			check: func(c Config) string {
				if !finite(c.TriggerWatermark) || c.TriggerWatermark <= 0 || c.TriggerWatermark > 1 {
					return "must be greater than 0.0 and at most 1.0"
				}
				return ""
			}},
		{flag: "chunk-size", env: "CHUNK_SIZE", kind: "int", usage: "tokens per KV chunk; must equal the MP servers' --chunk-size", i: func(c *Config) *int { return &c.ChunkSize },
			check: func(c Config) string { return minInt(c.ChunkSize, 1) }},
		{flag: "hash-algorithm", env: "HASH_ALGORITHM", kind: "string", usage: "token hash algorithm for pin key resolution (blake3, sha256_cbor)", s: func(c *Config) *string { return &c.HashAlgorithm },
			check: func(c Config) string {
				if strings.TrimSpace(c.HashAlgorithm) == "" {
					return "must be non-empty"
				}
				if _, err := tokenhash.New(c.HashAlgorithm, 1); err != nil {
					return "must be blake3 or sha256_cbor (got " + strconv.Quote(c.HashAlgorithm) + ")"
				}
				return ""
			}},
		{flag: "hash-root-hex", env: "HASH_ROOT_HEX", kind: "string", usage: "root (none) hash in hex for pin key resolution; must equal the MP servers' --hash-root-hex (empty: upstream's fallback root)", s: func(c *Config) *string { return &c.HashRootHex },
			check: func(c Config) string {
				if _, err := hex.DecodeString(c.HashRootHex); err != nil {
					return "must be an even number of hex digits (got " + strconv.Quote(c.HashRootHex) + ")"
				}
				return ""
			}},
		{flag: "blend-probe-stride", env: "BLEND_PROBE_STRIDE", kind: "int", usage: "positions between CacheBlend match probes", i: func(c *Config) *int { return &c.BlendProbeStride },
			check: func(c Config) string { return minInt(c.BlendProbeStride, 1) }},
		{flag: "timeout-keep-alive", env: "TIMEOUT_KEEP_ALIVE", kind: "int", usage: "seconds idle HTTP connections are kept open", i: func(c *Config) *int { return &c.TimeoutKeepAlive },
			check: func(c Config) string { return minInt(c.TimeoutKeepAlive, 1) }},
		{env: "ENABLE_STARTUP_RESYNC", kind: "bool", b: func(c *Config) *bool { return &c.EnableStartupResync }},
		{env: "RESYNC_POLL_INTERVAL", kind: "float", f: func(c *Config) *float64 { return &c.ResyncPollInterval },
			check: func(c Config) string { return gt0(c.ResyncPollInterval) }},
		{env: "RESYNC_MAX_WAIT", kind: "float", f: func(c *Config) *float64 { return &c.ResyncMaxWait },
			check: func(c Config) string { return ge0(c.ResyncMaxWait) }},
		{env: "RESYNC_PAGE_SIZE", kind: "int", i: func(c *Config) *int { return &c.ResyncPageSize },
			check: func(c Config) string { return minInt(c.ResyncPageSize, 1) }},
		{flag: "state-file", env: "STATE_FILE", kind: "string", usage: "persist quotas, the default limit and pins to this file (empty: memory only)", s: func(c *Config) *string { return &c.StateFile }},
		{flag: "metrics-top-salts", env: "METRICS_TOP_SALTS", kind: "int", usage: "per-salt metric series for the N salts with most tracked bytes (0: none)", i: func(c *Config) *int { return &c.MetricsTopSalts },
			check: func(c Config) string { return rangeInt(c.MetricsTopSalts, 0, 10000) }},
		{flag: "inflight-ttl", env: "INFLIGHT_TTL", kind: "float", usage: "seconds dispatched eviction victims are not re-sent while their delete events are awaited", f: func(c *Config) *float64 { return &c.InflightTTL },
			check: func(c Config) string { return ge0(c.InflightTTL) }},
		{flag: "auth-token", env: "AUTH_TOKEN", kind: "secret", usage: "bearer token required on every mutating route (POST /quota/events included) and the prefetch relay (empty: no authentication, as upstream)", s: func(c *Config) *string { return &c.AuthToken }},
		{flag: "mp-auth-token", env: "MP_AUTH_TOKEN", kind: "secret", usage: "bearer token sent to the MP servers (their --http-auth-token) on eviction, resync and prefetch calls; needs --auth-token unless --host is loopback", s: func(c *Config) *string { return &c.MPAuthToken },
			validate: checkMPTokenGuarded},
		{flag: "log-level", env: "LOG_LEVEL", kind: "string", usage: "log level: debug, info, warn or error", s: func(c *Config) *string { return &c.LogLevel },
			check: func(c Config) string {
				switch strings.ToLower(c.LogLevel) {
				case "debug", "info", "warn", "warning", "error":
					return ""
				}
				return "must be one of debug, info, warn, error"
			}},
		// The server's --log-format: the same flag, variable and values. Case
		// is ignored (LoadSources lowers it), as the coordinator always did.
		{flag: "log-format", fullEnv: "LMCACHE_LOG_FORMAT", kind: "string", usage: "log format: text, json or upstream (upstream's \"[time] LMCache LEVEL: message (file:line:logger)\" lines)", s: func(c *Config) *string { return &c.LogFormat },
			check: func(c Config) string {
				for _, f := range loglevel.Formats {
					if strings.EqualFold(c.LogFormat, f) {
						return ""
					}
				}
				return "must be one of " + strings.Join(loglevel.Formats, ", ")
			}},
	}, append(append(haFields(), ingestFields()...), tracingFields()...)...)
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func gt0(v float64) string {
	if !finite(v) || v <= 0 {
		return "must be > 0"
	}
	return ""
}

func ge0(v float64) string {
	if !finite(v) || v < 0 {
		return "must be >= 0"
	}
	return ""
}

func minInt(v, lo int) string {
	if v < lo {
		return fmt.Sprintf("must be >= %d", lo)
	}
	return ""
}

func rangeInt(v, lo, hi int) string {
	if v < lo || v > hi {
		return fmt.Sprintf("must be between %d and %d", lo, hi)
	}
	return ""
}

// envBool is upstream's environment boolean: true iff the trimmed,
// lower-cased value is 1, true, yes or on; anything else is false, never an
// error.
type envBool bool

func (b *envBool) Set(v string) error {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		*b = true
	default:
		*b = false
	}
	return nil
}

func (b *envBool) String() string { return strconv.FormatBool(bool(*b)) }

// EnvConfigFile names the coordinator's config file when --config-file is
// not given. Upstream's coordinator has no config file; the name follows
// its LMCACHE_MP_COORDINATOR_* variables.
const EnvConfigFile = EnvPrefix + "CONFIG_FILE"

// Load builds the configuration from defaults, then the config file
// (--config-file or LMCACHE_MP_COORDINATOR_CONFIG_FILE), then env (looked
// up with getenv), then args. Help goes to out. The returned error is one
// line naming the flag or env var and the rule it broke; it wraps ErrHelp
// after --help.
func Load(args []string, getenv func(string) (string, bool), out io.Writer) (Config, error) {
	cfg, _, err := LoadSources(args, getenv, out)
	return cfg, err
}

// LoadSources is Load that also reports where each setting came from,
// keyed by its config-file key ("chunk_size"), valued as
// cliflag.Entry.Provenance ("default", "flag:--port", "env:...", "file:...").
func LoadSources(args []string, getenv func(string) (string, bool), out io.Writer) (Config, map[string]string, error) {
	cfg := Default()
	def := Default()
	table := fieldsTable()
	set := cliflag.New("coordinator")
	set.ConfigFile("config-file", "", "YAML file of settings keyed by name in snake_case (port: 9300); flags and env vars override it", EnvConfigFile)
	entries := make([]*cliflag.Entry, len(table))
	for idx, fd := range table {
		e := &cliflag.Entry{Name: fd.flag, Env: fd.envVar(), Key: fd.key(), Usage: fd.usage,
			Default: valueString(def, fd), Secret: fd.kind == "secret"}
		switch fd.kind {
		case "float":
			e.Value = cliflag.Float(fd.f(&cfg))
		case "int":
			e.Value = cliflag.Int(fd.i(&cfg))
		case "string", "secret":
			e.Value = cliflag.String(fd.s(&cfg))
		case "bool":
			e.Value = (*envBool)(fd.b(&cfg))
		case "switch":
			e.Value = cliflag.Bool(fd.b(&cfg))
		}
		if fd.validate != nil {
			validate := fd.validate
			e.Validate = func() error { return validate(cfg) }
		}
		if fd.check != nil {
			check := fd.check
			e.Validate = func() error {
				if rule := check(cfg); rule != "" {
					return fmt.Errorf("%s (got %s)", rule, valueString(cfg, fd))
				}
				return nil
			}
		}
		entries[idx] = set.Add(e)
	}
	err := set.Parse(args, getenv)
	if errors.Is(err, cliflag.ErrHelp) {
		printHelp(out, set)
		return cfg, nil, ErrHelp
	}
	if err != nil {
		return cfg, nil, err
	}
	cfg.LogFormat = strings.ToLower(cfg.LogFormat) // checked case-insensitively
	sources := map[string]string{}
	for _, e := range entries {
		sources[e.Key] = e.Provenance()
	}
	cfg.Sources = sources
	return cfg, sources, nil
}

// printHelp is the coordinator's title, then the flag layer's settings
// list (flags, then the settings only the environment sets).
func printHelp(out io.Writer, set *cliflag.Set) {
	fmt.Fprintf(out, "Usage: lmcache coordinator [flags]\n\nRuns the LMCache MP fleet coordinator. Flags override LMCACHE_MP_COORDINATOR_* env vars, which override the config file.\n\n")
	set.WriteHelp(out)
}

// checkMPTokenGuarded refuses --mp-auth-token on a coordinator others can
// reach without --auth-token: POST /instances would then be open, and a
// registered instance's address is where eviction, resync and prefetch
// calls send the MP token, so anyone could register a host of theirs and
// collect it.
func checkMPTokenGuarded(c Config) error {
	if c.MPAuthToken == "" || c.AuthToken != "" || loopbackHost(c.Host) {
		return nil
	}
	return cliflag.Rule("needs --auth-token unless --host is a loopback address: without it anyone who reaches the coordinator can register an instance at an address of theirs and be sent this token")
}

// loopbackHost reports whether host (a --host value) binds loopback only:
// "localhost" or a loopback IP literal.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func valueString(cfg Config, fd field) string {
	switch fd.kind {
	case "float":
		return strconv.FormatFloat(*fd.f(&cfg), 'g', -1, 64)
	case "int":
		return strconv.Itoa(*fd.i(&cfg))
	case "string":
		return strconv.Quote(*fd.s(&cfg))
	case "secret":
		// A secret is never printed, not even in --help or an error line.
		if *fd.s(&cfg) == "" {
			return `""`
		}
		return "(set)"
	case "bool", "switch":
		if *fd.b(&cfg) {
			return "True"
		}
		return "False"
	}
	return ""
}

// Group is the one group of the coordinator's GET /config, named like the
// server's groups ("mp", "storage_manager", ...).
const Group = "coordinator"

// SourcesKey is GET /config's top-level key for where each value came
// from, as the server's.
const SourcesKey = "_sources"

// SourceUnknown is the provenance of every setting of a Config built in
// code rather than by LoadSources.
const SourceUnknown = "unknown"

// View is the body of the coordinator's GET /config, shaped as the
// server's: {"coordinator": {key: value}, "_sources": {"coordinator": {key:
// provenance}}}, with a setting's config-file key (the flag's name in
// snake_case, or the variable's suffix for an environment-only one). It is
// safe to serve: a secret setting is redact.Marker when set and "" when
// not, and the values then go through redact.Value (a secret-looking name,
// a URL's password). The provenances name a flag, a variable or a file,
// never a value, so a secret's is kept (redact.Value would hide it by its
// key): an operator can see which layer set the token.
func View(c Config) map[string]map[string]any {
	values, sources := map[string]any{}, map[string]any{}
	for _, fd := range fieldsTable() {
		key := fd.key()
		switch fd.kind {
		case "float":
			values[key] = *fd.f(&c)
		case "int":
			values[key] = *fd.i(&c)
		case "string":
			values[key] = *fd.s(&c)
		case "secret":
			values[key] = ""
			if *fd.s(&c) != "" {
				values[key] = redact.Marker
			}
		case "bool", "switch":
			values[key] = *fd.b(&c)
		}
		src, ok := c.Sources[key]
		if !ok {
			src = SourceUnknown
		}
		sources[key] = redact.String(src)
	}
	return map[string]map[string]any{Group: redact.Value(values).(map[string]any), SourcesKey: {Group: sources}}
}
