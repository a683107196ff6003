// Package httpapi is the MP server's operator HTTP API: every route of
// upstream's mp-server-http-api document (health, status, config, cache and
// quota management, runtime L2 reconfiguration, metrics, diagnostics), the
// bytes-level KV API (/api/kv/*) and GET /openapi.json. One route table
// drives both the mux and the OpenAPI document.
//
// Security beyond upstream: with an auth token configured, every route that
// returns cached content, configuration or tenant names, or changes state,
// requires "Authorization: Bearer <token>"; probes stay open. Configuration
// leaves the process only through package redact.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httplimit"
	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/loglevel"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/redact"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// EnvAuthToken is the environment variable that supplies --http-auth-token
// when the flag is not given.
const EnvAuthToken = "LMCACHE_HTTP_AUTH_TOKEN"

// EnvProtectMetrics set to "1" puts GET /metrics behind the auth token
// (Options.ProtectMetrics); there is no flag for it.
const EnvProtectMetrics = "LMCACHE_HTTP_AUTH_PROTECT_METRICS"

// Engine is the part of *engine.Engine the HTTP API uses (consumer-side
// interface, so handlers can be unit-tested with a fake).
type Engine interface {
	Ready() bool
	Status() map[string]any
	Counters() engine.Counters

	Adapters() []engine.AdapterInfo
	ListL2(ctx context.Context, index int, modelName string, pageSize int, pageToken string) (l2.Page, error)
	DeleteL2(ctx context.Context, index int, keys []objkey.Key) ([]objkey.Key, error)
	DeleteL1(keys []objkey.Key, force bool) (deleted, skipped int)
	Clear() engine.ClearResult

	RegisterLayout(l engine.Layout) error
	Layout(modelName string, worldSize int) (engine.Layout, error)
	Layouts() []engine.Layout

	Prefetch(req engine.PrefetchRequest) error
	PollPrefetch(id string) (engine.PrefetchResult, error)
	WaitPrefetch(ctx context.Context, id string) (engine.PrefetchResult, error)
	ReleaseRead(owner string, keys []objkey.Key, n int) int
	Put(keys []objkey.Key, data [][]byte) (int, error)
	// PutContext is Put; ctx's span (the request's) is the parent of the
	// write-behind uploads' spans.
	PutContext(ctx context.Context, keys []objkey.Key, data [][]byte) (int, error)
	Get(keys []objkey.Key) ([][]byte, error)

	Reconfigure(ctx context.Context, index int, op string, args map[string]any) (map[string]any, error)
	ReconfigureStatus(index int) (map[string]any, error)

	SetQuota(salt string, limitBytes int64) error
	DeleteQuota(salt string) bool
	Quota(salt string) (limitBytes int64, exists bool)
	Quotas() map[string]int64
	QuotaUsage() map[string]int64
}

var _ Engine = (*engine.Engine)(nil)

// KVBlockReader exposes registered KV caches for POST /cache/checksums. The
// data path implements it when it can read a worker's KV blocks; without
// one the endpoint answers 501 as upstream does for engines without
// cache contexts.
type KVBlockReader interface {
	// KVLayers returns the registered layers of instanceID. An unknown
	// instance returns an error wrapping ErrNotFound; a layout the reader
	// cannot address block-wise returns one wrapping ErrUnsupported.
	KVLayers(instanceID int) ([]KVLayer, error)
}

// KVLayer is one layer's KV tensor addressed by engine block id.
type KVLayer interface {
	// Block returns the bytes of block id in this layer. The caller is
	// done with them before its next Block call on any layer and keeps no
	// reference, so an implementation may hand out one reused buffer.
	Block(id int) ([]byte, error)
}

// Options configures New. Only Logger has no default.
type Options struct {
	// Engine may be nil at start; routes that need it answer 503 until
	// SetEngine is called and the engine reports Ready.
	Engine Engine
	// Config is GET /config: groups "mp", "storage_manager",
	// "observability" (and any others) of already-resolved settings
	// (defaults < env < flags). nil answers 503 "configs not initialized".
	Config map[string]map[string]any
	// Version and Commit default to buildinfo.Version / buildinfo.Commit.
	Version, Commit string
	// AuthToken, when set, guards every route that returns cached content,
	// reveals configuration or tenant names, or changes state with
	// "Authorization: Bearer <token>" (docs/security.md lists them).
	AuthToken string
	// ProtectMetrics puts GET /metrics behind AuthToken too
	// (LMCACHE_HTTP_AUTH_PROTECT_METRICS=1); off, scrapers need no token.
	ProtectMetrics bool
	// Limits bound header sizes, concurrent connections and slow clients;
	// zero fields take the httplimit defaults.
	Limits httplimit.Limits
	// RunScriptEnabled turns on POST /run_script (--run-script-api-enabled);
	// ScriptAllowedImports are the loadable modules (--script-allowed-imports).
	RunScriptEnabled     bool
	ScriptAllowedImports []string
	// Script limits; zero means the script package defaults.
	ScriptMaxSteps  uint64
	ScriptTimeout   time.Duration
	ScriptMaxOutput int
	// ScriptMemoryBytes is the sandbox process's memory budget.
	ScriptMemoryBytes int64
	// RegisteredModels are static layouts (--register-model) registered
	// with the engine when it is set.
	RegisteredModels []engine.Layout
	// ChunkSize and HashAlgorithm configure token hashing (--chunk-size,
	// --hash-algorithm); defaults 256 and blake3. Hasher overrides both.
	ChunkSize     int
	HashAlgorithm string
	Hasher        *tokenhash.Hasher
	// InstanceID labels target_info when Metrics is nil.
	InstanceID string
	// Metrics is the Prometheus registry; nil builds one.
	Metrics *mpmetrics.Metrics
	// LogLevels backs /loglevel; nil builds one over Logger's handler.
	LogLevels *loglevel.Registry
	// Periodic backs /periodic-threads*; nil is an empty registry.
	Periodic *periodic.Registry
	// StatusExtra contributes the data path's fields to GET /status
	// (active_sessions, registered_gpu_ids, cache_context_meta, ...).
	StatusExtra func() DataPathStatus
	// KVBlocks backs POST /cache/checksums; nil answers 501.
	KVBlocks KVBlockReader
	// KVEvents, if set, is given the tokens of /api/kv stores, so their
	// chunks are published as BlockStored (kvevents.Recorder).
	KVEvents KVEventBinder
	// EnvShowSecrets disables the redaction of secret-looking variables in
	// GET /env.
	EnvShowSecrets bool
	// Environ lists the environment for /env (default os.Environ).
	Environ func() []string
	// MaxKVBodyBytes caps POST /api/kv/store bodies (--http-kv-max-body-mb;
	// default 1 GiB).
	MaxKVBodyBytes int64
	// KVBodyBudgetBytes bounds the KV payload bytes held at once by all
	// in-flight /api/kv/store bodies and /api/kv/retrieve answers
	// together (--http-kv-body-budget-mb; default DefaultKVBodyBudgetBytes).
	// A store larger than it is 413; one that does not fit while others
	// hold it is 503 with Retry-After; a retrieve answer larger than it is
	// cut to the longest prefix that fits.
	KVBodyBudgetBytes int64
	// budgetHook, set by the tests (export_test.go), is called after each
	// reservation of the KV budget.
	budgetHook func(n int64)
	// BodyReadTimeout is the time a client has to send a request body,
	// per started 16 MiB the route allows; past it the request is 408.
	// Default 30 s.
	BodyReadTimeout time.Duration
	// Logger receives request and error logs; nil discards.
	Logger *slog.Logger
}

// KVEventBinder binds stored chunks to their tokens for KV events:
// hashes[i] covers tokens [i*chunk, (i+1)*chunk).
type KVEventBinder interface {
	BindTokens(hashes [][]byte, tokens []int64)
}

// Server is the HTTP API. It is safe for concurrent use.
type Server struct {
	opts    Options
	log     *slog.Logger
	hasher  *tokenhash.Hasher
	metrics *mpmetrics.Metrics
	levels  *loglevel.Registry
	loops   *periodic.Registry
	table   *httproute.Table
	handler http.Handler

	eng atomic.Pointer[engineHolder]

	regMu sync.Mutex // serializes static layout registration in SetEngine

	// budget bounds the KV payload bytes in flight (Options.KVBodyBudgetBytes).
	budget *bodyBudget

	// scriptFailures counts /run_script runs that failed, by reason (a
	// refused run, busy, is dropped work).
	scriptFailures *prometheus.CounterVec

	// secrets are the configured secret values (the auth token, keys in
	// the adapter JSON), scrubbed from error messages and script output.
	secrets []string

	// bg is the lifetime of work a handler leaves behind when its client
	// goes away (releasing an abandoned lookup's locks once its job ends);
	// Serve cancels it after the last handler returned and waits for bgWG.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
}

type engineHolder struct{ e Engine }

// New validates opts and builds the server and its mux.
func New(opts Options) (*Server, error) {
	s := &Server{opts: opts, log: opts.Logger}
	s.bg, s.bgCancel = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.opts.Version == "" {
		s.opts.Version = buildinfo.Version
	}
	if s.opts.Commit == "" {
		s.opts.Commit = buildinfo.Commit
	}
	s.hasher = opts.Hasher
	if s.hasher == nil {
		cs, algo := opts.ChunkSize, opts.HashAlgorithm
		if cs == 0 {
			cs = 256
		}
		if algo == "" {
			algo = tokenhash.Blake3
		}
		h, err := tokenhash.New(algo, cs)
		if err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
		s.hasher = h
	}
	s.metrics = opts.Metrics
	if s.metrics == nil {
		s.metrics = mpmetrics.New(opts.InstanceID, nil)
	}
	s.scriptFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lmcache_mp_run_script_failures_total",
		Help: "POST /run_script runs that failed, by reason: memory_limit, deadline, output_limit, busy (refused: no slot free for the whole deadline), cancelled (the client went away while waiting for a slot or while the script ran), import_not_allowed, sandbox, error (the script raised).",
	}, []string{"reason"})
	var err error
	if s.scriptFailures, err = register(s.metrics.Registry(), s.scriptFailures); err != nil {
		return nil, err
	}
	s.levels = opts.LogLevels
	if s.levels == nil {
		s.levels = loglevel.New(s.log.Handler(), slog.LevelInfo)
	}
	s.loops = opts.Periodic
	if s.loops == nil {
		s.loops = periodic.NewRegistry()
	}
	if s.opts.BodyReadTimeout <= 0 {
		s.opts.BodyReadTimeout = defaultBodyReadTimeout
	}
	if s.opts.MaxKVBodyBytes <= 0 {
		s.opts.MaxKVBodyBytes = 1 << 30
	}
	if s.opts.KVBodyBudgetBytes <= 0 {
		s.opts.KVBodyBudgetBytes = DefaultKVBodyBudgetBytes
	}
	budget, err := newBodyBudget(s.opts.KVBodyBudgetBytes, s.metrics.Registry())
	if err != nil {
		return nil, err
	}
	s.budget = budget
	s.budget.acquired = opts.budgetHook
	for _, l := range opts.RegisteredModels {
		if l.ModelName == "" || l.WorldSize < 1 || l.ObjectBytes <= 0 {
			return nil, fmt.Errorf("httpapi: invalid registered model %+v", l)
		}
	}
	s.secrets = append(redact.Collect(opts.Config), opts.AuthToken)
	t, err := s.buildTable()
	if err != nil {
		return nil, fmt.Errorf("httpapi: %w", err)
	}
	s.table, s.handler = t, t.Handler()
	if opts.Engine != nil {
		if err := s.SetEngine(opts.Engine); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// SetEngine wires the engine (and registers the static model layouts with
// it). Routes answer 503 until the engine also reports Ready.
func (s *Server) SetEngine(e Engine) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	for _, l := range s.opts.RegisteredModels {
		if err := e.RegisterLayout(l); err != nil {
			return fmt.Errorf("httpapi: register model %q world_size=%d: %w", l.ModelName, l.WorldSize, err)
		}
	}
	s.eng.Store(&engineHolder{e: e})
	s.metrics.SetSource(func() engine.Counters { return e.Counters() })
	return nil
}

// Metrics returns the server's metrics (for the data path and the
// coordinator client to feed).
func (s *Server) Metrics() *mpmetrics.Metrics { return s.metrics }

// Periodic returns the registry behind /periodic-threads, so other parts of
// the server (the coordinator client, the engine's loops) can register.
func (s *Server) Periodic() *periodic.Registry { return s.loops }

// LogLevels returns the registry behind /loglevel.
func (s *Server) LogLevels() *loglevel.Registry { return s.levels }

// Handler returns the HTTP handler (the mux behind auth and recovery).
func (s *Server) Handler() http.Handler { return s.handler }

// scrub replaces configured secret values in free text.
func (s *Server) scrub(text string) string { return redact.Secrets(text, s.secrets...) }

// engine returns the engine if it is wired and ready.
func (s *Server) engine() (Engine, error) {
	h := s.eng.Load()
	if h == nil || !h.e.Ready() {
		return nil, ErrNotInitialized
	}
	return h.e, nil
}

// Serve serves on ln until ctx is cancelled, then shuts down gracefully
// (in-flight requests get up to 5 s, then their connections are closed).
// It returns only after every handler has returned, so the caller may
// then close the engine. It returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := httplimit.NewServer(s.handler, s.opts.Limits, slog.NewLogLogger(s.log.Handler(), slog.LevelWarn))
	ln = httplimit.Listener(ln, s.opts.Limits)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		// Serve failed on its own: its connections may still run
		// handlers, which must end before the caller closes the engine.
		_ = srv.Stop(5 * time.Second)
		s.stopBackground()
		return err
	case <-ctx.Done():
	}
	err := srv.Stop(5 * time.Second)
	s.stopBackground()
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	if err != nil {
		return fmt.Errorf("httpapi: shutdown: %w", err)
	}
	return nil
}

// stopBackground ends the work handlers left behind and waits for it, so
// nothing uses the engine once Serve returns. An abandoned lookup whose
// job has not ended by then keeps its read leases until they expire (the
// engine is closed next).
func (s *Server) stopBackground() {
	s.bgCancel()
	s.bgWG.Wait()
}
