package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/bench"
	"github.com/lmcache-go/lmcache/internal/cliflag"
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/gcfloor"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/wire"
)

func init() {
	subcommands["bench"] = subcommand{"replay vLLM's engine-driven data-path sequence against a running server", runBench}
}

// benchFlags is `lmcache bench`'s command line: the Options, and the flags
// the subcommand itself handles.
type benchFlags struct {
	o        bench.Options
	baseMiB  int
	asJSON   bool
	report   string
	inprocGB float64
	chunk    int
	set      *cliflag.Set
}

// parseBenchFlags parses args with the flag layer the server and the
// coordinator use, so a bad value is the same one line
// ("--<flag>: <reason>", exit 2). The bench has no environment variables
// and no config file: a benchmark's settings are all on its command line.
func parseBenchFlags(args []string) (*benchFlags, error) {
	f := &benchFlags{o: bench.Defaults(), chunk: 256}
	f.baseMiB = int(f.o.BaselineBytes >> 20)
	o := &f.o
	set := cliflag.New("bench")
	f.set = set
	str := func(p *string, name, usage string) *cliflag.Entry {
		return set.Add(&cliflag.Entry{Name: name, Usage: usage, Value: cliflag.String(p), Default: strconv.Quote(*p)})
	}
	num := func(p *int, name string, min int, usage string) {
		set.Add(&cliflag.Entry{Name: name, Usage: usage, Value: cliflag.Int(p)}).Validate = func() error { return cliflag.AtLeast(*p, min) }
	}
	dur := func(p *time.Duration, name string, positive bool, usage string) {
		set.Add(&cliflag.Entry{Name: name, Usage: usage, Value: cliflag.Duration(p)}).Validate = func() error {
			switch {
			case positive && *p <= 0:
				return fmt.Errorf("must be > 0 (got %v)", *p)
			case *p < 0:
				return fmt.Errorf("must be >= 0 (got %v)", *p)
			}
			return nil
		}
	}
	flag := func(p *bool, name, usage string) {
		set.Add(&cliflag.Entry{Name: name, Usage: usage, Value: cliflag.Bool(p)})
	}
	str(&o.Endpoint, "endpoint", "server ZMQ endpoint")
	str(&o.ShmDir, "shm-dir", "directory of POSIX shared memory (the server's pool is opened there)")
	num(&o.Workers, "workers", 1, "concurrent simulated vLLM instances (scheduler + TP=1 worker each)")
	num(&o.Requests, "requests", 1, "measured requests per worker")
	num(&o.Warmup, "warmup", 0, "unmeasured requests per worker first")
	str(&o.Model, "model", "model name in the keys")
	num(&o.Layers, "num-layers", 1, "layers of the simulated model")
	num(&o.Hidden, "hidden-dim-size", 1, "per-token hidden size per layer (KV heads x head size)")
	str(&o.Dtype, "dtype", "float16|bfloat16|float32|uint8|float8_e4m3fn").Validate = func() error {
		// bench.Run refuses the same after dialling; here it costs no run.
		if _, ok := wire.DtypeSize(o.Dtype); !ok {
			return fmt.Errorf("unsupported dtype (got %q); want e.g. float16, bfloat16, float32, uint8, float8_e4m3fn", o.Dtype)
		}
		return nil
	}
	flag(&o.MLA, "mla", "MLA layout (no separate K and V)")
	num(&o.PromptTokens, "prompt-tokens", 1, "tokens per request")
	num(&o.LookupTokens, "lookup-tokens", 0, "prompt length of the lookup-latency phase (0 skips it)")
	num(&o.LookupSamples, "lookup-samples", 0, "lookups timed in the lookup-latency phase")
	num(&o.PingClients, "ping-clients", 0, "concurrent clients of the PING phase (0 skips it)")
	dur(&o.PingDuration, "ping-duration", false, "length of the PING phase")
	dur(&o.Progress, "progress", false, "progress line period on stderr when it is a terminal (0 = none)")
	dur(&o.Timeout, "timeout", true, "per-request timeout")
	num(&f.baseMiB, "baseline-mib", 0, "size of each worker's memcpy-baseline region in MiB (the pool's size compares like with like)")
	flag(&f.asJSON, "json", "print the result as JSON")
	str(&f.report, "report", "also write throughput and latency over time to this .svg chart or .html page (offline, no scripts)").Validate = func() error {
		// Checked before the run, so a typo does not cost a whole benchmark.
		if _, err := bench.CheckReportPath(f.report); f.report != "" && err != nil {
			return fmt.Errorf("want a .svg or .html file (got %q)", f.report)
		}
		return nil
	}
	set.Add(&cliflag.Entry{Name: "inprocess-l1-gb", Value: cliflag.Float(&f.inprocGB),
		Usage: "start an engine with this L1 size (GiB, in /dev/shm) and the data-path server inside this process on a free loopback port, and benchmark it over ZMQ (0 = use --endpoint)"}).Validate = func() error {
		if v := f.inprocGB; math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("must be finite and >= 0 (got %v)", v)
		}
		return nil
	}
	num(&f.chunk, "inprocess-chunk-size", 1, "--chunk-size of the in-process server")
	if err := set.Parse(args, noEnv); err != nil {
		return f, err
	}
	o.BaselineBytes = int64(f.baseMiB) << 20
	return f, nil
}

// noEnv is the bench's environment: none (see parseBenchFlags).
func noEnv(string) (string, bool) { return "", false }

// printBenchHelp is the bench's title, then the flag layer's settings
// list (its flags in their order, each with its default).
func printBenchHelp(w io.Writer, set *cliflag.Set) {
	fmt.Fprintf(w, "Usage: lmcache bench [flags]\n\nReplays vLLM's engine-driven data-path sequence against a running server.\n\n")
	set.WriteHelp(w)
}

// runBench is `lmcache bench`. Exit status: 0 done or --help, 1 the run
// failed, 2 invalid flags (one line, "lmcache bench: --<flag>: <reason>").
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseBenchFlags(args)
	if errors.Is(err, cliflag.ErrHelp) {
		printBenchHelp(stdout, f.set)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lmcache bench: %v\n", err)
		return 2
	}
	o := f.o
	if f.inprocGB > 0 {
		stop, endpoint, err := serveInProcess(ctx, int64(f.inprocGB*(1<<30)), f.chunk, stderr)
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
	term, _ := stderr.(*os.File)
	res, err := bench.Run(ctx, o, bench.ProgressWriter(term))
	if err != nil {
		fmt.Fprintf(stderr, "lmcache bench: %v\n", err)
		return 1
	}
	if f.report != "" {
		if err := bench.WriteReport(f.report, o, res); err != nil {
			fmt.Fprintf(stderr, "lmcache bench: %v\n", err)
			return 1
		}
	}
	if f.asJSON {
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
