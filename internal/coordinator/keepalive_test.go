package coordinator_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/pipenet"
)

// runPiped runs a coordinator with cfg on an in-memory listener (meant for
// a synctest bubble, where its deadlines pass on the fake clock); stop
// cancels it and checks Run's clean return.
func runPiped(t *testing.T, cfg config.Config) (*pipenet.Listener, func()) {
	t.Helper()
	srv, err := coordinator.New(cfg, coordinator.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ln := pipenet.New()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx, ln) }()
	return ln, func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// TestKeepAliveIdleTimeoutIsConfigured: --timeout-keep-alive is the idle
// time after which the server closes a kept-alive connection, to the
// clock tick. The coordinator runs in a synctest bubble on in-memory
// connections, so time passes only when the test sleeps: after one
// request the connection is still open 1 ms before the configured idle
// time (a second request is served on it), and closed by the server (EOF)
// 1 ms after it. The values are neither the flag's default (10 s) nor
// httplimit's (60 s), so a server ignoring the flag fails on one side.
func TestKeepAliveIdleTimeoutIsConfigured(t *testing.T) {
	for _, idle := range []int{1, 7} {
		t.Run(fmt.Sprintf("%ds", idle), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig()
				cfg.TimeoutKeepAlive = idle
				ln, stop := runPiped(t, cfg)
				defer stop()

				conn := ln.Dial()
				defer conn.Close()
				br := bufio.NewReader(conn)
				get := func(what string) {
					t.Helper()
					if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
						t.Fatalf("%s: write: %v", what, err)
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || resp.Close {
						t.Fatalf("%s: status %d close %v", what, resp.StatusCode, resp.Close)
					}
				}
				get("first request")
				// The server has gone back to waiting for the next request
				// (its idle deadline is set) once everything in the bubble
				// is blocked again.
				synctest.Wait()
				time.Sleep(time.Duration(idle)*time.Second - time.Millisecond)
				get(fmt.Sprintf("a request after %v idle", time.Duration(idle)*time.Second-time.Millisecond))

				synctest.Wait()
				read := make(chan error, 1)
				go func() { _, err := br.ReadByte(); read <- err }()
				time.Sleep(time.Duration(idle)*time.Second - time.Millisecond)
				synctest.Wait()
				select {
				case err := <-read:
					t.Fatalf("connection closed before %ds idle: %v", idle, err)
				default:
				}
				time.Sleep(2 * time.Millisecond)
				synctest.Wait()
				select {
				case err := <-read:
					if !errors.Is(err, io.EOF) {
						t.Fatalf("idle connection: read %v, want EOF (closed by the server)", err)
					}
				default:
					t.Fatalf("connection still open %v after %ds idle", time.Millisecond, idle)
				}
			})
		})
	}
}
