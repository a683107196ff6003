// Package coordtest runs the real coordinator in-process for the tests of
// its clients (coordclient, coordload): the production Server on a
// loopback listener, stopped when the test ends.
package coordtest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// Start runs a coordinator on ln (a fresh 127.0.0.1 port when ln is nil)
// and returns its base URL. The config is config.Default on loopback with
// the startup resync and the health-sweep and eviction loops off, then
// mutate's changes (mutate may be nil); logs are discarded. At the test's
// cleanup the coordinator is stopped and waited for, and an error from
// its Run fails the test.
func Start(t testing.TB, ln net.Listener, mutate func(*config.Config)) string {
	t.Helper()
	cfg := config.Default()
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.HealthCheckInterval, cfg.EvictionCheckInterval, cfg.EnableStartupResync = 0, 0, false
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := coordinator.New(cfg, coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("coordinator Run: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}
