package gpucheck

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/kvcuda"
	"github.com/lmcache-go/lmcache/internal/mq"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunOnFakeDriver: the stand-in worker's whole flow (register CUDA
// IPC wrappers pickled by python3, store, lookup, scramble, retrieve,
// byte-exact check) against a real server over ZMQ, with kvcuda.Fake in
// place of the GPU on both sides, for NHD and MLA; every handle the
// server opened is closed after the worker unregisters.
func TestRunOnFakeDriver(t *testing.T) {
	for _, layout := range []string{"nhd", "mla"} {
		t.Run(layout, func(t *testing.T) {
			f := kvcuda.NewFake()
			logger := slog.New(slog.DiscardHandler)
			eng, err := engine.New(engine.Config{L1SizeBytes: 32 << 20, ShmName: "gpucheck_test", ShmDir: t.TempDir()}, nil, logger)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := mq.New(mq.Config{Host: "127.0.0.1", Port: 0, ChunkSize: 256, CUDA: f}, eng, logger)
			if err != nil {
				_ = eng.Close()
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); _ = eng.Run(ctx) }()
			go func() { defer wg.Done(); _ = srv.Run(ctx) }()
			// Also on a failure: stop both, then close the engine checking
			// that the worker's flow left no reference behind.
			t.Cleanup(func() { cancel(); wg.Wait(); closeEngine(t, eng) })
			var out bytes.Buffer
			res, err := Run(Config{Endpoint: srv.Endpoint(), Layout: layout, Bytes: 12 << 20, Layers: 2, Out: &out}, FakeDevice{F: f})
			if err != nil {
				t.Fatal(err)
			}
			if res.Bytes < 8<<20 || res.StoreGBs <= 0 || res.RetrieveGBs <= 0 || !strings.Contains(out.String(), "round trip byte-exact") {
				t.Fatalf("result %+v\n%s", res, out.String())
			}
			if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=1 ctx=0" {
				t.Fatalf("after the worker unregistered: %s", got)
			}
			cancel()
			wg.Wait()
			if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=0 ctx=0" {
				t.Fatalf("after the server stopped: %s", got)
			}
		})
	}
}

// closeEngine closes eng once its Run returned and fails t, naming the
// keys, if a read lease, pin or staged write is left.
func closeEngine(t *testing.T, eng *engine.Engine) {
	t.Helper()
	if err := eng.CloseChecked(); err != nil {
		t.Error(err)
	}
}
