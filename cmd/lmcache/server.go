package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/lmcache-go/lmcache/internal/coordclient"
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/gcfloor"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/kvevents"
	"github.com/lmcache-go/lmcache/internal/l2"
	_ "github.com/lmcache-go/lmcache/internal/l2/dax"   // registers type "dax"
	_ "github.com/lmcache-go/lmcache/internal/l2/fault" // registers type "fault_inject"
	_ "github.com/lmcache-go/lmcache/internal/l2/fs"    // registers type "fs"
	_ "github.com/lmcache-go/lmcache/internal/l2/s3"    // registers type "s3"
	"github.com/lmcache-go/lmcache/internal/loglevel"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/redact"
	"github.com/lmcache-go/lmcache/internal/serverconfig"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/tracing"
)

func init() {
	subcommands["server"] = subcommand{"run the MP KV-cache server (ZMQ data path + HTTP API)", runServer}
}

func runServer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := serverconfig.Parse(args, stdout)
	if errors.Is(err, serverconfig.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lmcache server: %v\n", err)
		return 2
	}
	base, err := loglevel.NewHandler(stderr, cfg.LogFormat)
	if err != nil {
		fmt.Fprintf(stderr, "lmcache server: --log-format: %v\n", err)
		return 2
	}
	root, _ := loglevel.ParseLevel(cfg.LogLevel) // validated by serverconfig
	levels := loglevel.New(base, root)
	logger := levels.Logger("lmcache")

	// Error texts can quote configuration; the configured secret values
	// are replaced before they reach the log.
	secrets := append(redact.Collect(cfg.Groups()), cfg.HTTPAuthToken, cfg.CoordinatorAuthToken)
	scrub := func(err error) string { return redact.Secrets(err.Error(), secrets...) }
	s, err := newServer(ctx, cfg, levels)
	if err != nil {
		// Configuration that only fails when applied (adapter JSON, layouts,
		// ports in use) is still the operator's input: one line, status 2
		// for bad values, 1 for runtime failures.
		var bad *usageError
		if errors.As(err, &bad) {
			fmt.Fprintf(stderr, "lmcache server: %s\n", scrub(err))
			return 2
		}
		logger.Error("startup failed", "err", scrub(err))
		return 1
	}
	if err := s.run(ctx); err != nil {
		logger.Error("server stopped with an error", "err", scrub(err))
		return 1
	}
	return 0
}

// usageError marks a startup failure caused by a flag value.
type usageError struct{ err error }

func (u *usageError) Error() string { return u.err.Error() }
func (u *usageError) Unwrap() error { return u.err }

// server holds the components of `lmcache server`; run starts them in
// dependency order and stops them in reverse (engine last).
type server struct {
	log      *slog.Logger
	eng      *engine.Engine
	adapters []l2.Adapter
	mq       *mq.Server
	api      *httpapi.Server
	httpLn   net.Listener
	coord    *coordclient.Client
	kv       *kvevents.Recorder
	sink     *kafkaevents.Sink // --coordinator-event-transport kafka; nil otherwise
	tr       *tracing.Provider
	// cfgGroups is the resolved configuration, logged (redacted) at start.
	cfgGroups map[string]map[string]any
	// gcHeapFloorMB is --gc-heap-floor-mb, set while run runs.
	gcHeapFloorMB int
}

func newServer(ctx context.Context, cfg *serverconfig.Config, levels *loglevel.Registry) (*server, error) {
	s := &server{log: levels.Logger("lmcache"), cfgGroups: cfg.Groups(), gcHeapFloorMB: cfg.GCHeapFloorMB}
	var root []byte
	if cfg.HashRootHex != "" {
		root, _ = hex.DecodeString(cfg.HashRootHex) // validated by serverconfig
	}
	var hopts []tokenhash.Option
	if root != nil {
		hopts = append(hopts, tokenhash.WithRoot(root))
	}
	hasher, err := tokenhash.New(cfg.HashAlgorithm, cfg.ChunkSize, hopts...)
	if err != nil {
		return nil, &usageError{fmt.Errorf("--hash-algorithm: %w", err)}
	}

	specs, err := l2.ParseSpecs(cfg.L2Adapters)
	if err != nil {
		return nil, &usageError{l2AdapterError(err)}
	}
	var layouts []engine.Layout
	for _, m := range cfg.RegisterModel {
		l, err := httpapi.ParseRegisterModel(m, cfg.ChunkSize)
		if err != nil {
			return nil, &usageError{err}
		}
		layouts = append(layouts, l)
	}
	ecfg := engineConfig(cfg)
	for _, sp := range specs {
		ac := engine.AdapterConfig{Shared: sp.Shared}
		if sp.Eviction != nil {
			ev := *sp.Eviction
			ac.Eviction = &ev
		}
		ecfg.L2 = append(ecfg.L2, ac)
	}

	// The engine's loops (eviction, store and prefetch workers) register in
	// the same registry as the others below.
	loops := periodic.NewRegistry()
	ecfg.Loops = loops

	// Acquire resources; on any failure release what was acquired, in reverse.
	ok := false
	defer func() {
		if !ok {
			s.release()
		}
	}()
	if s.adapters, err = l2.OpenAll(ctx, specs); err != nil {
		return nil, err
	}
	for i, a := range s.adapters {
		s.adapters[i] = tracing.Adapter(a) // storage-level spans when tracing is on
	}
	if s.eng, err = engine.New(ecfg, s.adapters, levels.Logger("lmcache.engine")); err != nil {
		return nil, &usageError{err}
	}
	for _, l := range layouts {
		if err := s.eng.RegisterLayout(l); err != nil {
			return nil, &usageError{fmt.Errorf("--register-model %s: %w", l.ModelName, err)}
		}
	}

	// One metrics registry and one loop registry serve the HTTP API, the data
	// path and the coordinator client, so /metrics and /periodic-threads show
	// all of them.
	instanceID := cfg.InstanceID
	if instanceID == "" {
		instanceID = coordclient.NewInstanceID()
	}
	metrics := mpmetrics.New(instanceID, nil)
	metrics.Registry().MustRegister(loops.Collector(mpmetrics.Namespace)) // lmcache_mp_periodic_thread_*
	if s.tr, err = startTracing(ctx, cfg, instanceID, metrics, levels.Logger("lmcache.tracing")); err != nil {
		return nil, &usageError{err}
	}
	mqcfg := mq.Defaults()
	mqcfg.Host, mqcfg.Port = cfg.Host, cfg.Port
	mqcfg.TransferMode, mqcfg.WireProfile = cfg.SupportedTransferMode, cfg.WireProfile
	mqcfg.ChunkSize, mqcfg.HashAlgorithm, mqcfg.HashRoot = cfg.ChunkSize, cfg.HashAlgorithm, root
	mqcfg.WorkerReapTimeout = seconds(cfg.WorkerReapTimeoutSeconds)
	mqcfg.WorkerRegistrationGrace = seconds(cfg.WorkerRegistrationGrace)
	mqcfg.SessionTTL = seconds(cfg.SessionTTLSeconds)
	mqcfg.Metrics = metrics
	mqcfg.Periodic = loops
	mqcfg.MaxQueued = cfg.MaxQueuedRequests
	mqcfg.BusyPoll = time.Duration(cfg.ZMQBusyPollUS) * time.Microsecond
	if s.kv, err = kvevents.New(kvevents.Config{LogSize: cfg.KVEventLogSize, BlockSize: cfg.ChunkSize, Loops: loops,
		Publisher: kvevents.PublisherConfig{Endpoint: cfg.KVEventsEndpoint, ReplayEndpoint: cfg.KVEventsReplayEndpoint, Topic: cfg.KVEventsTopic,
			BufferSteps: cfg.KVEventsBufferSteps, HWM: cfg.KVEventsHWM, MaxQueueSize: cfg.KVEventsMaxQueueSize},
		Dropped: metrics.KVEventsDrop, ReplayFailed: metrics.KVEventsReplayFailed,
		Logger: levels.Logger("lmcache.kv_events")}); err != nil {
		return nil, &usageError{err}
	}
	if s.kv.Enabled() {
		s.eng.AddKVEventSink(s.kv)
	}
	mqcfg.KVEvents = s.kv
	if s.mq, err = mq.New(mqcfg, s.eng, levels.Logger("lmcache.mq")); err != nil {
		return nil, &usageError{err}
	}

	var publisher coordclient.Publisher
	if cfg.CoordinatorEventTransport == "kafka" {
		brokers, err := kafkaevents.ParseBrokers(cfg.CoordinatorKafkaBootstrapServers)
		if err != nil {
			return nil, &usageError{fmt.Errorf("--coordinator-event-transport kafka needs --coordinator-kafka-bootstrap-servers: %w", err)}
		}
		if s.sink, err = kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: brokers, Topic: cfg.CoordinatorKafkaTopic,
			DeliveryTimeout: seconds(cfg.CoordinatorKafkaDeliveryTimeout), Logger: levels.Logger("lmcache.kafka_sink")}); err != nil {
			return nil, &usageError{err}
		}
		metrics.Registry().MustRegister(s.sink.Collectors()...)
		publisher = s.sink
	}
	ccfg := coordClientConfig(cfg, instanceID)
	ccfg.Periodic, ccfg.Metrics, ccfg.Publisher = loops, metrics, publisher
	ccfg.Logger = levels.Logger("lmcache.coordinator_client")
	s.coord, err = coordclient.New(ccfg)
	if err != nil {
		return nil, &usageError{err}
	}
	if s.coord.Enabled() && cfg.CoordinatorEventReporting {
		// One listener per adapter, so /events batches name their backend.
		for _, a := range s.eng.Adapters() {
			s.adapters[a.Index].AddListener(s.coord.Listener(a.TypeName, a.Shared))
		}
	}

	s.api, err = httpapi.New(httpapi.Options{
		Engine:               s.eng,
		Config:               cfg.ConfigView(), // the groups, plus "_sources": where each value came from
		AuthToken:            cfg.HTTPAuthToken,
		RunScriptEnabled:     cfg.RunScriptAPIEnabled,
		ProtectMetrics:       cfg.HTTPAuthProtectMetrics, // --http-auth-protect-metrics / httpapi.EnvProtectMetrics
		ScriptAllowedImports: cfg.ScriptAllowedImports,
		RegisteredModels:     layouts,
		ChunkSize:            cfg.ChunkSize,
		HashAlgorithm:        cfg.HashAlgorithm,
		Hasher:               hasher,
		InstanceID:           instanceID,
		Metrics:              metrics,
		Periodic:             loops,
		StatusExtra:          s.mq.Status,
		KVBlocks:             s.mq,
		KVEvents:             s.kv,
		LogLevels:            levels,
		EnvShowSecrets:       cfg.EnvShowSecret,
		KVBodyBudgetBytes:    cfg.HTTPKVBodyBudgetBytes(),
		MaxKVBodyBytes:       cfg.HTTPKVMaxBodyBytes(),
		Logger:               levels.Logger("lmcache.http"),
	})
	if err != nil {
		return nil, &usageError{err}
	}
	addr := net.JoinHostPort(cfg.HTTPHost, strconv.Itoa(cfg.HTTPPort))
	if s.httpLn, err = net.Listen("tcp", addr); err != nil {
		return nil, fmt.Errorf("http listen on %s: %w", addr, err)
	}
	ok = true
	return s, nil
}

// engineConfig is the engine's configuration from the flags, its L2
// adapters and loops aside. --l1-use-lazy and --l1-init-size-gb are not
// passed on: they are accepted for upstream's command lines only (the pool
// is always committed lazily by the kernel, page by page), and leaving
// them out makes "no effect" something a test can check
// (TestL1LazyFlagsHaveNoEffect).
func engineConfig(cfg *serverconfig.Config) engine.Config {
	shmMode, _ := cfg.SHMModeBits() // validated by serverconfig
	return engine.Config{
		L1SizeBytes:              cfg.L1SizeBytes(),
		L1AlignBytes:             int64(cfg.L1AlignBytes),
		L1UseHugepages:           cfg.L1UseHugepages,
		L1ReadTTL:                seconds(cfg.L1ReadTTLSeconds),
		L1WriteTTL:               seconds(cfg.L1WriteTTLSeconds),
		ShmName:                  cfg.SHMName,
		ShmMode:                  os.FileMode(shmMode),
		EvictionPolicy:           cfg.EvictionPolicy,
		EvictionTriggerWatermark: cfg.EvictionWatermark,
		EvictionRatio:            cfg.EvictionRatio,
		L2StorePolicy:            cfg.L2StorePolicy,
		L2PrefetchPolicy:         cfg.L2PrefetchPolicy,
		L2PrefetchMaxInFlight:    cfg.L2PrefetchMaxInFlight,
		L2PrefetchLoadTimeout:    seconds(cfg.L2PrefetchLoadTimeout),
		L2LookupTimeout:          time.Duration(cfg.L2LookupTimeoutMS) * time.Millisecond,
		StoreMaxAttempts:         cfg.L2StoreMaxRetries + 1, // the first attempt is not a retry
		StoreRetryBase:           seconds(cfg.L2StoreRetryBackoffSecs),
	}
}

// coordClientConfig is the coordinator client's part of the server flags
// (the loops, metrics, logger and Kafka publisher are added by newServer).
func coordClientConfig(cfg *serverconfig.Config, instanceID string) coordclient.Config {
	return coordclient.Config{
		URL:                cfg.CoordinatorURL,
		AdvertiseIP:        cfg.CoordinatorAdvertiseIP,
		HTTPPort:           cfg.HTTPPort,
		InstanceID:         instanceID,
		HeartbeatInterval:  seconds(cfg.CoordinatorHeartbeatInterval),
		EventReporting:     cfg.CoordinatorEventReporting,
		EventFlushInterval: seconds(cfg.CoordinatorEventFlushInterval),
		QueueSize:          cfg.EventBusQueueSize,
		AuthToken:          cfg.CoordinatorAuthToken,
		EventEndpoint:      cfg.CoordinatorEventEndpoint,
	}
}

// l2AdapterError puts an l2.ParseSpecs error in the flag layer's shape,
// "--l2-adapter: <reason>", naming the flag once as every other flag error
// does (l2's own text, upstream's, names it twice). The original error
// stays in the chain (errors.Is(err, l2.ErrConfig)).
func l2AdapterError(err error) error {
	var se *l2.SpecError
	if !errors.As(err, &se) {
		return err
	}
	return &rephrased{text: "--l2-adapter: " + se.Reason(), err: err}
}

// rephrased is err with another text, for errors of packages whose
// messages do not have the flag layer's shape.
type rephrased struct {
	text string
	err  error
}

func (r *rephrased) Error() string { return r.text }
func (r *rephrased) Unwrap() error { return r.err }

// run serves until ctx is cancelled. The engine runs under its own context
// so that it outlives the front ends: they drain first, then it stops. The
// KV event publisher outlives the engine in turn (started before it,
// stopped after it), so the records of the engine's last uploads and
// removals are sent, not refused by a publisher already stopped.
func (s *server) run(ctx context.Context) error {
	defer s.release()
	floor := gcfloor.Start(int64(s.gcHeapFloorMB) << 20)
	defer floor.Stop()
	kvCtx, stopKV := context.WithCancel(context.Background())
	kvDone := make(chan struct{})
	go func() { defer close(kvDone); _ = s.kv.Run(kvCtx) }() // Run always returns nil
	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- s.eng.Run(engCtx) }()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.mq.Run(gctx) })
	g.Go(func() error { return s.api.Serve(gctx, s.httpLn) })
	g.Go(func() error { return s.coord.Run(gctx) })
	s.log.Info("lmcache server started", "http", s.httpLn.Addr().String(), "zmq", s.mq.Endpoint(), "pool", s.eng.Pool().Name)
	s.log.Debug("lmcache server configuration", "config", redact.Value(s.cfgGroups))
	err := g.Wait()
	stopEngine()
	if engErr := <-engDone; err == nil && engErr != nil && !errors.Is(engErr, context.Canceled) {
		err = engErr
	}
	stopKV() // the publisher sends what is still queued, then closes
	<-kvDone
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	s.log.Info("lmcache server stopped")
	return err
}

// release frees what newServer acquired; safe on a partial server.
func (s *server) release() {
	if s.httpLn != nil {
		_ = s.httpLn.Close()
	}
	if s.kv != nil {
		s.kv.Close()
	}
	if s.sink != nil {
		// After the coordinator client's last flush: queued records get
		// kafkaevents.CloseFlushTimeout to reach the brokers.
		_ = s.sink.Close()
	}
	if s.eng != nil {
		_ = s.eng.Close()
	}
	// The engine releases its pool only; adapters belong to the server.
	for _, a := range s.adapters {
		_ = a.Close()
	}
	if s.tr != nil {
		stopTracing(s.tr) // last: spans of the shutdown itself are flushed too
	}
}

func seconds(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
