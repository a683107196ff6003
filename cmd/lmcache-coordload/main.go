// Command lmcache-coordload drives a coordinator's POST /quota/events with
// N distinct keys and prints throughput and request latency; see package
// coordload.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lmcache-go/lmcache/internal/coordload"
)

func main() {
	cfg, err := coordload.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lmcache-coordload: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := coordload.Run(ctx, cfg, coordload.NewClient(cfg.Concurrency))
	fmt.Println(res)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lmcache-coordload: %v\n", err)
		stop()
		os.Exit(1)
	}
}
