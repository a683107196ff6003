package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/lmcache-go/lmcache/internal/serverconfig"
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
	logger := newLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	if err := serve(ctx, cfg, logger); err != nil {
		logger.Error("server stopped with an error", "err", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, cfg *serverconfig.Config, logger *slog.Logger) error {
	addr := net.JoinHostPort(cfg.HTTPHost, strconv.Itoa(cfg.HTTPPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"message":"LMCache MP server is running"}`)
	})
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"healthy"}`)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("HTTP API listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}
