package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/tracing"
)

func init() {
	subcommands["coordinator"] = subcommand{"run the MP fleet coordinator (registry, quotas, eviction, pins)", runCoordinator}
}

// runCoordinator parses flags over LMCACHE_MP_COORDINATOR_* env vars (and
// LMCACHE_LOG_FORMAT, shared with the server) over the config file and serves until ctx is cancelled. Exit status: 0 clean
// stop or --help, 1 runtime failure, 2 invalid configuration (one line,
// "lmcache coordinator: --<flag>: <reason>").
func runCoordinator(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, sources, err := config.LoadSources(args, os.LookupEnv, stdout)
	if errors.Is(err, config.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lmcache coordinator: %v\n", err)
		return 2
	}
	log := newLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	log.Debug("coordinator configuration sources", "sources", sources)
	var counted atomic.Pointer[coordinator.Server]
	// Every HTTP request is a span once a provider is active: the server
	// is built by httplimit.NewServer, whose handler is tracing's wrapper.
	tr, err := tracing.Start(ctx, tracing.Config{
		Enabled: cfg.Tracing.Enabled, Endpoint: cfg.Tracing.Endpoint, Level: cfg.Tracing.Level,
		ServiceName: "lmcache-mp-coordinator", ServiceVersion: buildinfo.Labels()["version"],
		Logger: log,
		// Lost spans are counted on the coordinator's /metrics; the
		// coordinator exists only after tracing started, and no span can
		// be lost before it serves a request.
		Dropped: func(reason string, n int) {
			if s := counted.Load(); s != nil {
				s.CountDroppedSpans(reason, n)
			}
		},
	})
	if err != nil {
		fmt.Fprintf(stderr, "lmcache coordinator: %v\n", err)
		return 2
	}
	defer stopTracing(tr) // after Run: the spans of the last requests are flushed too
	srv, err := coordinator.New(cfg, coordinator.WithLogger(log))
	if err != nil {
		fmt.Fprintf(stderr, "lmcache coordinator: %v\n", err)
		return 1
	}
	counted.Store(srv)
	ln, err := net.Listen("tcp", cfg.Addr())
	if err != nil {
		fmt.Fprintf(stderr, "lmcache coordinator: listen %s: %v\n", cfg.Addr(), err)
		return 1
	}
	if err := srv.Run(ctx, ln); err != nil {
		fmt.Fprintf(stderr, "lmcache coordinator: %v\n", err)
		return 1
	}
	return 0
}
