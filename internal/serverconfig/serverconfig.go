// Package serverconfig holds every flag of `lmcache server`, with upstream's
// names, defaults and environment fallbacks, its validation, and the
// grouped view GET /config reports (mp, storage_manager, observability,
// http, coordinator).
//
// Precedence is upstream's: flag > deprecated flag > environment >
// default, with the config file (--config-file, LMCACHE_CONFIG_FILE) between
// the environment and the defaults. Parsing is internal/cliflag's, shared
// with the coordinator.
package serverconfig

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/cliflag"
	"github.com/lmcache-go/lmcache/internal/loglevel"
)

// GiB is what upstream means by GB in flags: 2^30 bytes.
const GiB = 1 << 30

// DefaultL1SizeGB is the embedded default L1 size. Upstream requires
// --l1-size-gb; a bare `lmcache server` here starts with a modest pool.
const DefaultL1SizeGB = 1.0

// Config is the parsed command line of `lmcache server`.
type Config struct {
	// mp group: the request (ZMQ) server.
	Host                     string
	Port                     int
	InstanceID               string
	ChunkSize                int
	HashAlgorithm            string
	HashRootHex              string
	EngineType               string
	SupportedTransferMode    string
	WireProfile              string
	Transport                string
	SHMName                  string
	MaxWorkers               int
	ScriptAllowedImports     []string
	RunScriptAPIEnabled      bool
	WorkerReapTimeoutSeconds float64
	WorkerRegistrationGrace  float64
	SessionTTLSeconds        float64
	MaxQueuedRequests        int
	GCHeapFloorMB            int
	ZMQBusyPollUS            int
	SeparateObjectGroups     bool
	// KV events for KV-aware routers (internal/kvevents): upstream's
	// POLL_KV_EVENTS log size, and the native vLLM-format publisher named
	// as vLLM's --kv-events-config names its fields (empty endpoint: off).
	KVEventLogSize         int
	KVEventsEndpoint       string
	KVEventsReplayEndpoint string
	KVEventsTopic          string
	KVEventsBufferSteps    int
	KVEventsHWM            int
	KVEventsMaxQueueSize   int

	// http group.
	HTTPHost      string
	HTTPPort      int
	HTTPAuthToken string
	// HTTPAuthProtectMetrics puts GET /metrics behind HTTPAuthToken too
	// (--http-auth-protect-metrics, EnvProtectMetrics).
	HTTPAuthProtectMetrics bool
	RegisterModel          []string
	LogFormat              string
	LogLevel               string
	EnvShowSecret          bool
	// HTTPKVBodyBudgetMB bounds the KV payload (MiB) all in-flight
	// /api/kv/store bodies and /api/kv/retrieve answers hold together
	// (httpapi.Options.KVBodyBudgetBytes; see HTTPKVBodyBudgetBytes).
	HTTPKVBodyBudgetMB int
	// HTTPKVMaxBodyMB caps one /api/kv/store body (MiB;
	// httpapi.Options.MaxKVBodyBytes; see HTTPKVMaxBodyBytes).
	HTTPKVMaxBodyMB int

	// storage_manager group.
	L1SizeGB                float64
	L1UseLazy               bool
	L1InitSizeGB            float64
	L1AlignBytes            int
	L1UseHugepages          bool
	SHMMode                 string
	L1WriteTTLSeconds       float64
	L1ReadTTLSeconds        float64
	EvictionPolicy          string
	EvictionWatermark       float64
	EvictionRatio           float64
	L2StorePolicy           string
	L2PrefetchPolicy        string
	L2PrefetchMaxInFlight   int
	L2PrefetchLoadTimeout   float64
	L2LookupTimeoutMS       int
	PeriodicNotifierMS      int
	L2Adapters              []string
	L2StoreMaxRetries       int
	L2StoreRetryBackoffSecs float64

	// observability group.
	DisableObservability bool
	DisableMetrics       bool
	DisableLogging       bool
	EnableTracing        bool
	OTLPEndpoint         string
	EventBusQueueSize    int
	MetricsSampleRate    float64
	PrometheusPort       int
	TraceLevel           string

	// coordinator group.
	CoordinatorURL                string
	CoordinatorAdvertiseIP        string
	CoordinatorHeartbeatInterval  float64
	CoordinatorEventReporting     bool
	CoordinatorEventFlushInterval float64
	// CoordinatorAuthToken is the bearer token sent to the coordinator. It is
	// a secret: --help prints its default as "", and GET /config shows it as
	// Redacted whenever it is set.
	CoordinatorAuthToken string
	// CoordinatorEventEndpoint is where event batches go: auto (POST
	// /events, falling back to /quota/events on a 404), events or
	// quota-events.
	CoordinatorEventEndpoint string
	// CoordinatorEventTransport is http (POST the batches) or kafka (publish
	// them through the Kafka sink); registration and heartbeats stay HTTP.
	CoordinatorEventTransport string
	// CoordinatorKafkaBootstrapServers is the comma-separated broker list
	// (required with the kafka transport).
	CoordinatorKafkaBootstrapServers string
	// CoordinatorKafkaTopic is the cache-event topic.
	CoordinatorKafkaTopic string
	// CoordinatorKafkaDeliveryTimeout is how long (seconds) the producer
	// retries a record before dropping it.
	CoordinatorKafkaDeliveryTimeout float64

	reg *registry
}

// EnvProtectMetrics is --http-auth-protect-metrics' variable; it has the
// name httpapi.EnvProtectMetrics documents, now parsed (and refused when it
// is not a boolean) by the flag layer like every other variable.
const EnvProtectMetrics = "LMCACHE_HTTP_AUTH_PROTECT_METRICS"

// EnvConfigFile names the config file when --config-file is not given.
const EnvConfigFile = "LMCACHE_CONFIG_FILE"

// EnvUpstreamConfig is newest upstream's variable for its --config-file
// (a TOML file), read after EnvConfigFile.
const EnvUpstreamConfig = "LMCACHE_MP_CONFIG"

// Group names as GET /config reports them.
const (
	GroupMP            = "mp"
	GroupHTTP          = "http"
	GroupStorage       = "storage_manager"
	GroupObservability = "observability"
	GroupCoordinator   = "coordinator"
)

// ErrHelp is returned by Parse when --help was asked for; the help text has
// been written and the binary exits 0.
var ErrHelp = flag.ErrHelp

// Parse parses args (without the subcommand) with the process environment.
func Parse(args []string, help io.Writer) (*Config, error) {
	return ParseEnv(args, osLookupEnv, help)
}

// ParseEnv is Parse with an explicit environment, for tests.
func ParseEnv(args []string, lookupEnv func(string) (string, bool), help io.Writer) (*Config, error) {
	c := &Config{}
	r := c.register()
	err := r.parse(args, lookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		r.printHelp(help, "Usage: lmcache server [flags]\n\nThe LMCache multiprocess KV-cache server.")
		return nil, ErrHelp
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Groups is the configuration as GET /config shows it.
func (c *Config) Groups() map[string]map[string]any {
	g, _ := c.reg.groups()
	return g
}

// SourcesKey is the extra top-level key of GET /config that holds Sources;
// the leading underscore keeps it apart from upstream's group names.
const SourcesKey = "_sources"

// Sources mirrors Groups, group for group and key for key, with where each
// value came from: "default", "flag:--chunk-size", "env:LMCACHE_LOG_LEVEL"
// or "file:/etc/lmcache/server.yaml".
func (c *Config) Sources() map[string]map[string]string {
	_, s := c.reg.groups()
	return s
}

// ConfigView is Groups with Sources under SourcesKey: the body of GET
// /config.
func (c *Config) ConfigView() map[string]map[string]any {
	g, s := c.reg.groups()
	src := map[string]any{}
	for group, keys := range s {
		src[group] = keys
	}
	g[SourcesKey] = src
	return g
}

// DefaultHTTPKVBodyBudgetMB is --http-kv-body-budget-mb's default: 2 GiB,
// twice the 1 GiB per-request cap of a KV store, so the largest store and
// other transfers fit together. It is not tied to --l1-size-gb: the budget
// bounds heap taken beside the L1 pool, which a large pool should not grow.
const DefaultHTTPKVBodyBudgetMB = 2048

// DefaultHTTPKVMaxBodyMB is --http-kv-max-body-mb's default: 1 GiB, the
// KV of about 8,000 tokens of an 8B model in fp16.
const DefaultHTTPKVMaxBodyMB = 1024

// HTTPKVMaxBodyBytes is --http-kv-max-body-mb in bytes.
func (c *Config) HTTPKVMaxBodyBytes() int64 { return int64(c.HTTPKVMaxBodyMB) << 20 }

// HTTPKVBodyBudgetBytes is --http-kv-body-budget-mb in bytes.
func (c *Config) HTTPKVBodyBudgetBytes() int64 { return int64(c.HTTPKVBodyBudgetMB) << 20 }

// L1SizeBytes is --l1-size-gb in bytes, truncated as upstream's int(gb*2^30).
func (c *Config) L1SizeBytes() int64 { return int64(c.L1SizeGB * GiB) }

// L1InitSizeBytes is --l1-init-size-gb in bytes, capped at the L1 size.
func (c *Config) L1InitSizeBytes() int64 {
	return min(int64(c.L1InitSizeGB*GiB), c.L1SizeBytes())
}

func (c *Config) register() *registry {
	r := newRegistry("server")
	c.reg = r
	mp, h, sm, ob, co := GroupMP, GroupHTTP, GroupStorage, GroupObservability, GroupCoordinator

	r.set.ConfigFile("config-file", mp, "YAML (or, named *.toml, TOML) file of settings keyed by flag name in snake_case (chunk_size: 512); flags and environment variables override it; env also "+EnvUpstreamConfig, EnvConfigFile, EnvUpstreamConfig)

	// mp
	r.str(&c.Host, "host", "host", mp, "", "localhost", "host the ZMQ request server binds")
	r.intv(&c.Port, "port", "port", mp, "", 5555, "port of the ZMQ request server").Validate = port(&c.Port)
	r.str(&c.InstanceID, "instance-id", "instance_id", mp, "", "", "instance id for the coordinator (empty: a random UUID)")
	r.intv(&c.ChunkSize, "chunk-size", "chunk_size", mp, "", 256, "tokens per chunk").Validate = atLeast(&c.ChunkSize, 1)
	r.str(&c.HashAlgorithm, "hash-algorithm", "hash_algorithm", mp, "", "blake3", "token hash algorithm: blake3 or sha256_cbor").Validate = oneOf(&c.HashAlgorithm, "blake3", "sha256_cbor", "sha256_cbor_64bit")
	r.str(&c.HashRootHex, "hash-root-hex", "hash_root_hex", mp, "LMCACHE_HASH_ROOT_HEX", "", "override the root (none) hash, hex; empty: upstream's fallback H(0,[0])").Validate = func() error {
		for _, ch := range strings.ToLower(c.HashRootHex) {
			if !strings.ContainsRune("0123456789abcdef", ch) {
				return fmt.Errorf("must be hex (got %q)", c.HashRootHex)
			}
		}
		if len(c.HashRootHex)%2 != 0 {
			return fmt.Errorf("must have an even number of hex digits (got %d)", len(c.HashRootHex))
		}
		return nil
	}
	r.str(&c.EngineType, "engine-type", "engine_type", mp, "", "default", "engine type: default (blend is not supported)").Validate = oneOf(&c.EngineType, "default")
	r.str(&c.SupportedTransferMode, "supported-transfer-mode", "supported_transfer_mode", mp, "", "auto", "auto (serves both paths), engine_driven (the worker copies through the shared L1 pool) or lmcache_driven (the server copies from the worker's registered KV cache: CPU shared memory, or CUDA IPC where libcuda.so.1 loads; the CUDA backend has not yet run on a GPU); a worker of the other mode is refused with one log line and lmcache_mp_zmq_refused_requests_total{reason=\"transfer_mode\"}").Validate = oneOf(&c.SupportedTransferMode, "auto", "engine_driven", "lmcache_driven")
	r.str(&c.WireProfile, "wire-profile", "wire_profile", mp, "", "auto", "ZMQ RequestType numbering: auto (per connection), gen2m or gen3").Validate = oneOf(&c.WireProfile, "auto", "gen2m", "gen3")
	r.str(&c.Transport, "transport", "transport", mp, "", "zmq", "request transport (only zmq)").Validate = oneOf(&c.Transport, "zmq")
	r.str(&c.SHMName, "shm-name", "shm_name", mp, "", "", "name of the L1 shared-memory pool under /dev/shm (prefixed lmcache_l1_pool_); empty: private memory").Validate = func() error { return checkShmName(c.SHMName) }
	r.intv(&c.MaxWorkers, "max-workers", "max_workers", mp, "", 1, "request worker goroutines per transfer kind").Validate = atLeast(&c.MaxWorkers, 1)
	r.list(&c.ScriptAllowedImports, "script-allowed-imports", "script_allowed_imports", mp, "modules POST /run_script may load", true)
	r.boolFlag(&c.RunScriptAPIEnabled, "run-script-api-enabled", "run_script_api_enabled", mp, "", "enable POST /run_script")
	r.float(&c.WorkerReapTimeoutSeconds, "worker-reap-timeout-seconds", "worker_reap_timeout_seconds", mp, "", 120, "reap workers silent this long; 0 disables").Validate = func() error {
		v := c.WorkerReapTimeoutSeconds
		if v != 0 && (v < 30 || math.IsInf(v, 0) || math.IsNaN(v)) {
			return fmt.Errorf("must be 0 or finite and >= 30 (got %v)", v)
		}
		return seconds(&c.WorkerReapTimeoutSeconds, true)()
	}
	r.float(&c.WorkerRegistrationGrace, "worker-registration-grace-seconds", "worker_registration_grace_seconds", mp, "", 3600, "grace before an idle registration may be reaped").Validate = func() error {
		// NaN compares false with everything, so it passed the order
		// check below; the seconds rule refuses it (and +Inf).
		if err := seconds(&c.WorkerRegistrationGrace, true)(); err != nil {
			return err
		}
		if c.WorkerRegistrationGrace < c.WorkerReapTimeoutSeconds {
			return fmt.Errorf("must be >= --worker-reap-timeout-seconds (got %v < %v)", c.WorkerRegistrationGrace, c.WorkerReapTimeoutSeconds)
		}
		return nil
	}
	r.float(&c.SessionTTLSeconds, "session-ttl-seconds", "session_ttl_seconds", mp, "", 600, "drop lookup sessions idle this long").Validate = seconds(&c.SessionTTLSeconds, false)
	r.intv(&c.MaxQueuedRequests, "max-queued-requests", "max_queued_requests", mp, "", 4096, "ZMQ requests that may wait for a handler; past it a request is refused at once").Validate = atLeast(&c.MaxQueuedRequests, 1)
	r.intv(&c.ZMQBusyPollUS, "zmq-busy-poll-us", "zmq_busy_poll_us", mp, "", 0, "keep polling the ZMQ socket this long after a message before blocking, so a request right behind it (LOOKUP's second round trip) is taken without a thread wake-up; costs up to this much CPU per burst (lmcache_mp_zmq_busy_poll_seconds_total); 0: block at once").Validate = durationInt(&c.ZMQBusyPollUS, time.Microsecond, "microseconds")
	r.intv(&c.GCHeapFloorMB, "gc-heap-floor-mb", "gc_heap_floor_mb", mp, "", 64, "Go heap size below which the garbage collector does not start (request frames are copied into the heap; a small heap collected every few LOOKUPs); 0: GOGC alone").Validate = inRangeInt(&c.GCHeapFloorMB, 0, math.MaxInt64>>20)
	r.boolPair(&c.SeparateObjectGroups, "separate-object-groups", "separate_object_groups", mp, "", false, "store hybrid-model object groups separately")
	r.intv(&c.KVEventLogSize, "kv-event-log-size", "kv_event_log_size", mp, "", 32768, "cache-event records kept for POLL_KV_EVENTS (workers republish them to KV-aware routers); 0 disables the channel and its kv_events capability").Validate = inRangeInt(&c.KVEventLogSize, 0, MaxPreallocated)
	r.str(&c.KVEventsEndpoint, "kv-events-endpoint", "kv_events_endpoint", mp, "", "", "ZMQ PUB address of the native vLLM-format KV events publisher (bound when it has * or :: or is ipc:// or inproc://, else connected, as vLLM); empty: off")
	r.str(&c.KVEventsReplayEndpoint, "kv-events-replay-endpoint", "kv_events_replay_endpoint", mp, "", "", "ZMQ ROUTER address (bound) that resends retained KV event batches from a requested sequence; empty: no replay")
	r.str(&c.KVEventsTopic, "kv-events-topic", "kv_events_topic", mp, "", "", "topic frame of every published KV event batch")
	r.intv(&c.KVEventsBufferSteps, "kv-events-buffer-steps", "kv_events_buffer_steps", mp, "", 10000, "published KV event batches kept for replay").Validate = atLeast(&c.KVEventsBufferSteps, 1)
	r.intv(&c.KVEventsHWM, "kv-events-hwm", "kv_events_hwm", mp, "", 100000, "send high-water mark of the KV events PUB socket (messages kept for a subscriber that does not read)").Validate = atLeast(&c.KVEventsHWM, 1)
	r.intv(&c.KVEventsMaxQueueSize, "kv-events-max-queue-size", "kv_events_max_queue_size", mp, "", 100000, "KV event batches waiting to be published; past it a batch is dropped and counted in lmcache_mp_kv_events_dropped_total{reason=\"publisher_queue_full\"}").Validate = inRangeInt(&c.KVEventsMaxQueueSize, 1, MaxPreallocated)

	// http
	r.str(&c.HTTPHost, "http-host", "http_host", h, "", "127.0.0.1", "host the HTTP API binds (upstream's older default was 0.0.0.0)")
	r.intv(&c.HTTPPort, "http-port", "http_port", h, "", 8080, "port of the HTTP API").Validate = port(&c.HTTPPort)
	r.secret(&c.HTTPAuthToken, "http-auth-token", "", h, "LMCACHE_HTTP_AUTH_TOKEN", "bearer token required by mutating and sensitive routes; empty: no auth")
	r.boolFlag(&c.HTTPAuthProtectMetrics, "http-auth-protect-metrics", "http_auth_protect_metrics", h, EnvProtectMetrics, "also require --http-auth-token on GET /metrics (scrapers then need the token)")
	r.list(&c.RegisterModel, "register-model", "register_model", h, `static model layout JSON {"model_name","world_size","num_layers","hidden_size","dtype"} (repeatable)`, false)
	r.str(&c.LogFormat, "log-format", "log_format", h, "LMCACHE_LOG_FORMAT", "text", "log format: text, json or upstream (upstream's \"[time] LMCache LEVEL: message (file:line:logger)\" lines)").Validate = oneOf(&c.LogFormat, loglevel.Formats...)
	r.str(&c.LogLevel, "log-level", "log_level", h, "LMCACHE_LOG_LEVEL", "INFO", "log level: DEBUG, INFO, WARNING, ERROR").Validate = func() error {
		c.LogLevel = strings.ToUpper(c.LogLevel)
		return oneOf(&c.LogLevel, "DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")()
	}
	r.intv(&c.HTTPKVBodyBudgetMB, "http-kv-body-budget-mb", "http_kv_body_budget_mb", h, "LMCACHE_HTTP_KV_BODY_BUDGET_MB", DefaultHTTPKVBodyBudgetMB, "MiB of KV payload that all in-flight POST /api/kv/store bodies and /api/kv/retrieve answers may hold together; past it a store is refused with 503 and Retry-After (lmcache_mp_http_kv_body_budget_refused_total), a store larger than it is 413, a longer retrieve answer is cut to the prefix that fits").Validate = inRangeInt(&c.HTTPKVBodyBudgetMB, 1, math.MaxInt64>>20)
	maxBody := r.intv(&c.HTTPKVMaxBodyMB, "http-kv-max-body-mb", "http_kv_max_body_mb", h, "LMCACHE_HTTP_KV_MAX_BODY_MB", DefaultHTTPKVMaxBodyMB, "MiB of KV payload one POST /api/kv/store may carry (413 past it); at most --http-kv-body-budget-mb (unset: 1024, or the budget if smaller)")
	maxBody.Validate = func() error {
		if err := inRangeInt(&c.HTTPKVMaxBodyMB, 1, math.MaxInt64>>20)(); err != nil {
			return err
		}
		if c.HTTPKVMaxBodyMB > c.HTTPKVBodyBudgetMB {
			if maxBody.Source() == cliflag.FromDefault {
				// Only the budget was lowered: its stores are the
				// largest it can hold.
				c.HTTPKVMaxBodyMB = c.HTTPKVBodyBudgetMB
				return nil
			}
			return fmt.Errorf("must be <= --http-kv-body-budget-mb (%d), which every store body must fit (got %d)", c.HTTPKVBodyBudgetMB, c.HTTPKVMaxBodyMB)
		}
		return nil
	}
	r.boolFlag(&c.EnvShowSecret, "env-show-secrets", "env_show_secrets", h, "", "GET /env shows values whose names look secret")

	// storage_manager
	r.float(&c.L1SizeGB, "l1-size-gb", "l1_size_gb", sm, "", DefaultL1SizeGB, "L1 size in GiB").Validate = sizeGB(&c.L1SizeGB)
	r.boolPair(&c.L1UseLazy, "l1-use-lazy", "l1_use_lazy", sm, "", true, "grow the L1 pool on demand (ignored with --shm-name, which maps it whole)")
	r.float(&c.L1InitSizeGB, "l1-init-size-gb", "l1_init_size_gb", sm, "", 20, "initial lazy L1 size in GiB (capped at --l1-size-gb)").Validate = sizeGB(&c.L1InitSizeGB)
	r.intv(&c.L1AlignBytes, "l1-align-bytes", "l1_align_bytes", sm, "", 4096, "L1 allocation alignment (power of two)").Validate = func() error {
		if a := c.L1AlignBytes; a <= 0 || a&(a-1) != 0 {
			return fmt.Errorf("must be a power of two (got %d)", a)
		}
		return nil
	}
	r.boolFlag(&c.L1UseHugepages, "l1-use-hugepages", "l1_use_hugepages", sm, "", "back L1 with 2 MiB huge pages")
	r.str(&c.SHMMode, "shm-mode", "shm_mode", sm, "", "0600", "file mode of the shared-memory pool (octal)").Validate = func() error {
		if _, err := c.SHMModeBits(); err != nil {
			return err
		}
		return nil
	}
	r.float(&c.L1WriteTTLSeconds, "l1-write-ttl-seconds", "l1_write_ttl_seconds", sm, "", 600, "write lease of an L1 object").Validate = seconds(&c.L1WriteTTLSeconds, false)
	r.float(&c.L1ReadTTLSeconds, "l1-read-ttl-seconds", "l1_read_ttl_seconds", sm, "", 300, "read lease of an L1 object").Validate = seconds(&c.L1ReadTTLSeconds, false)
	r.str(&c.EvictionPolicy, "eviction-policy", "eviction_policy", sm, "", "LRU", "L1 eviction policy: LRU, IsolatedLRU or noop").Validate = oneOf(&c.EvictionPolicy, "LRU", "IsolatedLRU", "noop")
	r.float(&c.EvictionWatermark, "eviction-trigger-watermark", "eviction_trigger_watermark", sm, "", 0.8, "L1 usage that triggers eviction").Validate = inRange(&c.EvictionWatermark, 0, 1, true)
	r.float(&c.EvictionRatio, "eviction-ratio", "eviction_ratio", sm, "", 0.2, "fraction of tracked keys evicted per cycle").Validate = inRange(&c.EvictionRatio, 0, 1, false)
	r.str(&c.L2StorePolicy, "l2-store-policy", "l2_store_policy", sm, "", "default", "default or skip_l1").Validate = oneOf(&c.L2StorePolicy, "default", "skip_l1")
	r.str(&c.L2PrefetchPolicy, "l2-prefetch-policy", "l2_prefetch_policy", sm, "", "default", "default (temporary) or retain").Validate = oneOf(&c.L2PrefetchPolicy, "default", "retain")
	r.intv(&c.L2PrefetchMaxInFlight, "l2-prefetch-max-in-flight", "l2_prefetch_max_in_flight", sm, "", 8, "concurrent L2 prefetch requests").Validate = atLeast(&c.L2PrefetchMaxInFlight, 1)
	r.float(&c.L2PrefetchLoadTimeout, "l2-prefetch-load-timeout", "l2_prefetch_load_timeout", sm, "", 0, "seconds before an L2 load is abandoned; 0: none").Validate = seconds(&c.L2PrefetchLoadTimeout, true)
	r.intv(&c.L2LookupTimeoutMS, "l2-lookup-timeout-ms", "l2_lookup_timeout_ms", sm, "LMCACHE_L2_LOOKUP_TIMEOUT_MS", 200, "how long a lookup waits for L2 adapters to say which keys they hold before it answers with what it has (the L1 prefix); 0: no limit").Validate = durationInt(&c.L2LookupTimeoutMS, time.Millisecond, "milliseconds")
	r.intv(&c.PeriodicNotifierMS, "periodic-notifier-interval-ms", "periodic_notifier_interval_ms", sm, "", 5, "accepted for compatibility").Validate = atLeast(&c.PeriodicNotifierMS, 1)
	r.list(&c.L2Adapters, "l2-adapter", "l2_adapter", sm, `L2 adapter JSON, e.g. {"type":"s3",...} (repeatable; order = cascade order)`, false)
	r.intv(&c.L2StoreMaxRetries, "l2-store-max-retries", "l2_store_max_retries", sm, "", 5, "retries of a failed write-behind upload before it is abandoned and counted (the L1 copy stays until then)").Validate = inRangeInt(&c.L2StoreMaxRetries, 0, math.MaxInt32)
	r.float(&c.L2StoreRetryBackoffSecs, "l2-store-retry-backoff-seconds", "l2_store_retry_backoff_seconds", sm, "", 1, "first retry delay of a failed upload; doubles per attempt").Validate = seconds(&c.L2StoreRetryBackoffSecs, false)

	// observability
	r.boolFlag(&c.DisableObservability, "disable-observability", "disable_observability", ob, "", "disable metrics and event reporting")
	r.boolFlag(&c.DisableMetrics, "disable-metrics", "disable_metrics", ob, "", "disable GET /metrics collection")
	r.boolFlag(&c.DisableLogging, "disable-logging", "disable_logging", ob, "", "accepted for compatibility")
	r.boolFlag(&c.EnableTracing, "enable-tracing", "enable_tracing", ob, "", "export OpenTelemetry spans over OTLP/gRPC to --otlp-endpoint (required with it)")
	r.str(&c.OTLPEndpoint, "otlp-endpoint", "otlp_endpoint", ob, "", "", "OTLP gRPC endpoint for --enable-tracing spans: http://host:4317 or host:port (plaintext), https://host:port (TLS); metrics stay on GET /metrics")
	r.intv(&c.EventBusQueueSize, "event-bus-queue-size", "event_bus_queue_size", ob, "", 10000, "bound of the coordinator event queue").Validate = atLeast(&c.EventBusQueueSize, 1)
	r.float(&c.MetricsSampleRate, "metrics-sample-rate", "metrics_sample_rate", ob, "", 0.01, "accepted for compatibility").Validate = inRange(&c.MetricsSampleRate, 0, 1, false)
	r.intv(&c.PrometheusPort, "prometheus-port", "prometheus_port", ob, "", 9090, "ignored by lmcache server (metrics are on the HTTP port), as upstream")
	r.str(&c.TraceLevel, "trace-level", "trace_level", ob, "", "storage", "span depth with --enable-tracing: storage (request spans plus L2 operations) or events (request spans only)").Validate = oneOf(&c.TraceLevel, "storage", "events")

	// coordinator: flag > deprecated flag > env > default.
	r.str(&c.CoordinatorURL, "coordinator-url", "coordinator_url", co, "LMCACHE_COORDINATOR_URL", "", "coordinator base URL; empty: not registered")
	r.str(&c.CoordinatorAdvertiseIP, "coordinator-advertise-ip", "coordinator_advertise_ip", co, "LMCACHE_COORDINATOR_ADVERTISE_IP", "", "IP the coordinator uses to reach this server (empty: the outbound IP)")
	r.float(&c.CoordinatorHeartbeatInterval, "coordinator-heartbeat-interval", "coordinator_heartbeat_interval", co, "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL", 5, "seconds between heartbeats").Validate = seconds(&c.CoordinatorHeartbeatInterval, false)
	r.truthyFlag(&c.CoordinatorEventReporting, "coordinator-event-reporting", "coordinator_event_reporting", co, "LMCACHE_COORDINATOR_EVENT_REPORTING", "report L2 store, lookup and delete events to the coordinator")
	r.float(&c.CoordinatorEventFlushInterval, "coordinator-event-flush-interval", "coordinator_event_flush_interval", co, "LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL", 1, "seconds between event flushes").Validate = seconds(&c.CoordinatorEventFlushInterval, false)
	r.secret(&c.CoordinatorAuthToken, "coordinator-auth-token", "coordinator_auth_token", co, "LMCACHE_COORDINATOR_AUTH_TOKEN", "bearer token sent to the coordinator; empty: none")
	r.str(&c.CoordinatorEventEndpoint, "coordinator-event-endpoint", "coordinator_event_endpoint", co, "LMCACHE_COORDINATOR_EVENT_ENDPOINT", "auto", "where usage events go: auto (POST /events, and POST /quota/events once the coordinator answers 404 there), events or quota-events").Validate = oneOf(&c.CoordinatorEventEndpoint, "auto", "events", "quota-events")
	// Upstream's Kafka transport flags have no environment fallback.
	r.str(&c.CoordinatorEventTransport, "coordinator-event-transport", "coordinator_event_transport", co, "", "http", "how cache-event batches reach the coordinator: http (POST) or kafka (the Kafka topic; needs --coordinator-kafka-bootstrap-servers)").Validate = oneOf(&c.CoordinatorEventTransport, "http", "kafka")
	r.str(&c.CoordinatorKafkaBootstrapServers, "coordinator-kafka-bootstrap-servers", "coordinator_kafka_bootstrap_servers", co, "", "", "comma-separated Kafka brokers for --coordinator-event-transport kafka")
	r.str(&c.CoordinatorKafkaTopic, "coordinator-kafka-topic", "coordinator_kafka_topic", co, "", "lmcache-cache-events", "Kafka topic for cache-event batches")
	r.float(&c.CoordinatorKafkaDeliveryTimeout, "coordinator-kafka-delivery-timeout", "coordinator_kafka_delivery_timeout", co, "", 300, "seconds the Kafka producer retries a record before dropping it").Validate = seconds(&c.CoordinatorKafkaDeliveryTimeout, false)
	r.alias("coordinator-l2-event-reporting", "coordinator-event-reporting", "LMCACHE_COORDINATOR_L2_EVENT_REPORTING")
	r.alias("coordinator-l2-event-flush-interval", "coordinator-event-flush-interval", "LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL")
	return r
}

// SHMModeBits parses --shm-mode as an octal file mode.
func (c *Config) SHMModeBits() (uint32, error) {
	var m uint32
	if _, err := fmt.Sscanf(c.SHMMode, "%o", &m); err != nil || m > 0o777 {
		return 0, fmt.Errorf("must be an octal file mode such as 0600 (got %q)", c.SHMMode)
	}
	return m, nil
}
