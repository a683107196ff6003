package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/lmcache-go/lmcache/internal/bench"
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
	fs.DurationVar(&o.Progress, "progress", o.Progress, "progress line period on stderr (0 = none)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "per-request timeout")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lmcache bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	t0 := time.Now()
	res, err := bench.Run(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "lmcache bench: %v\n", err)
		return 1
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
