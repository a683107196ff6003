package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/bench"
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/gcfloor"
	"github.com/lmcache-go/lmcache/internal/mq"
)

func init() {
	subcommands["bench"] = subcommand{"replay vLLM's engine-driven data-path sequence against a running server", runBench}
}

// runBench is `lmcache bench`.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := bench.Defaults()
	fs := flag.NewFlagSet("lmcache bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "server ZMQ endpoint")
	fs.StringVar(&o.ShmDir, "shm-dir", o.ShmDir, "directory of POSIX shared memory (the server's pool is opened there)")
	fs.IntVar(&o.Workers, "workers", o.Workers, "concurrent simulated vLLM instances (scheduler + TP=1 worker each)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "measured requests per worker")
	fs.IntVar(&o.Warmup, "warmup", o.Warmup, "unmeasured requests per worker first")
	fs.StringVar(&o.Model, "model", o.Model, "model name in the keys")
	fs.IntVar(&o.Layers, "num-layers", o.Layers, "layers of the simulated model")
	fs.IntVar(&o.Hidden, "hidden-dim-size", o.Hidden, "per-token hidden size per layer (KV heads x head size)")
	fs.StringVar(&o.Dtype, "dtype", o.Dtype, "float16|bfloat16|float32|uint8|float8_e4m3fn")
	fs.BoolVar(&o.MLA, "mla", o.MLA, "MLA layout (no separate K and V)")
	fs.IntVar(&o.PromptTokens, "prompt-tokens", o.PromptTokens, "tokens per request")
	fs.IntVar(&o.LookupTokens, "lookup-tokens", o.LookupTokens, "prompt length of the lookup-latency phase (0 skips it)")
	fs.IntVar(&o.LookupSamples, "lookup-samples", o.LookupSamples, "lookups timed in the lookup-latency phase")
	fs.IntVar(&o.PingClients, "ping-clients", o.PingClients, "concurrent clients of the PING phase (0 skips it)")
	fs.DurationVar(&o.PingDuration, "ping-duration", o.PingDuration, "length of the PING phase")
	fs.DurationVar(&o.Progress, "progress", o.Progress, "progress line period on stderr when it is a terminal (0 = none)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "per-request timeout")
	baseMiB := fs.Int64("baseline-mib", o.BaselineBytes>>20, "size of each worker's memcpy-baseline region in MiB (the pool's size compares like with like)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	report := fs.String("report", "", "also write throughput and latency over time to this .svg chart or .html page (offline, no scripts)")
	inproc := fs.Float64("inprocess-l1-gb", 0, "start an engine with this L1 size (GiB, in /dev/shm) and the data-path server inside this process on a free loopback port, and benchmark it over ZMQ (0 = use --endpoint)")
	chunk := fs.Int("inprocess-chunk-size", 256, "--chunk-size of the in-process server")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	o.BaselineBytes = *baseMiB << 20
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lmcache bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *report != "" {
		if _, err := bench.CheckReportPath(*report); err != nil {
			fmt.Fprintf(stderr, "lmcache bench: %v\n", err)
			return 2
		}
	}
	if *inproc > 0 {
		stop, endpoint, err := serveInProcess(ctx, int64(*inproc*(1<<30)), *chunk, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "lmcache bench: in-process server: %v\n", err)
			return 1
		}
		defer stop()
		o.Endpoint, o.ShmDir = endpoint, "/dev/shm"
	}
	// The bench is a client with the server's allocation pattern (160 KiB
	// key frames over a small heap): the same floor keeps its own
	// collections out of the latencies it times.
	defer gcfloor.Start(64 << 20).Stop()
	t0 := time.Now()
	// Progress only on a terminal: piped output and CI logs keep the summary.
	f, _ := stderr.(*os.File)
	res, err := bench.Run(ctx, o, bench.ProgressWriter(f))
	if err != nil {
		fmt.Fprintf(stderr, "lmcache bench: %v\n", err)
		return 1
	}
	if *report != "" {
		if err := bench.WriteReport(*report, o, res); err != nil {
			fmt.Fprintf(stderr, "lmcache bench: %v\n", err)
			return 1
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
		return 0
	}
	bench.Report(stdout, o, res)
	fmt.Fprintf(stdout, "total time: %v\n", time.Since(t0).Round(time.Millisecond))
	return 0
}

// serveInProcess runs the real engine and data-path server for --inprocess-l1-gb.
func serveInProcess(ctx context.Context, l1Bytes int64, chunk int, stderr io.Writer) (stop func(), endpoint string, err error) {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	eng, err := engine.New(engine.Config{L1SizeBytes: l1Bytes, ShmName: fmt.Sprintf("bench%d", os.Getpid())}, nil, logger)
	if err != nil {
		return nil, "", err
	}
	srv, err := mq.New(mq.Config{Host: "127.0.0.1", ChunkSize: chunk}, eng, logger)
	if err != nil {
		_ = eng.Close()
		return nil, "", err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	// A server that stops early makes the bench fail on timeouts; say why.
	run := func(name string, f func(context.Context) error) {
		defer wg.Done()
		if err := f(ctx); err != nil {
			logger.Error("in-process "+name+" stopped", "err", err)
		}
	}
	go run("engine", eng.Run)
	go run("data-path server", srv.Run)
	return func() { cancel(); wg.Wait(); _ = eng.Close() }, srv.Endpoint(), nil
}
