// Command lmcache-gpucheck is the stand-in vLLM worker of
// scripts/gpu-check.sh (internal/gpucheck): against a running
// `lmcache server` it registers a CUDA paged KV cache, stores and
// retrieves it byte-exact and prints GB/s beside raw copies. With
// --fake-driver it runs an in-process server and worker on kvcuda.Fake
// (no GPU; a rehearsal of the flow, not a measurement of one).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/gpucheck"
	"github.com/lmcache-go/lmcache/internal/kvcuda"
	"github.com/lmcache-go/lmcache/internal/mq"
)

func main() {
	// The CUDA context is current on this OS thread only.
	runtime.LockOSThread()
	endpoint := flag.String("endpoint", "tcp://127.0.0.1:5555", "the lmcache server's ZMQ endpoint")
	layout := flag.String("layout", "nhd", "paged KV layout: nhd or mla")
	gib := flag.Float64("gib", 1, "KV cache size in GiB (1 to 4)")
	layers := flag.Int("layers", 32, "model layers")
	fake := flag.Bool("fake-driver", false, "rehearse on kvcuda.Fake with an in-process server (no GPU)")
	flag.Parse()
	cfg := gpucheck.Config{Endpoint: *endpoint, Layout: *layout, Bytes: int64(*gib * (1 << 30)), Layers: *layers, Out: os.Stdout}
	if err := run(cfg, *fake); err != nil {
		fmt.Fprintln(os.Stderr, "lmcache-gpucheck:", err)
		if errors.Is(err, gpucheck.ErrNoGPU) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

func run(cfg gpucheck.Config, fake bool) error {
	if !fake {
		dev, err := gpucheck.OpenCUDA(0)
		if err != nil {
			return err
		}
		_, err = gpucheck.Run(cfg, dev)
		return err
	}
	fmt.Println("FAKE DRIVER: host memory stands in for the GPU; no figure below is a GPU figure")
	f := kvcuda.NewFake()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	eng, err := engine.New(engine.Config{L1SizeBytes: cfg.Bytes*5/4 + 64<<20, ShmName: ""}, nil, logger)
	if err != nil {
		return err
	}
	defer eng.Close()
	srv, err := mq.New(mq.Config{Host: "127.0.0.1", Port: 0, ChunkSize: 256, CUDA: f}, eng, logger)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = eng.Run(ctx) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	cfg.Endpoint = srv.Endpoint()
	_, err = gpucheck.Run(cfg, gpucheck.FakeDevice{F: f})
	return err
}
