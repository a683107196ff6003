// Command lmcache-coordload is the coordinator load tool; see package
// coordload. Modes (--mode):
//
//   - http (default): POST /quota/events with N distinct keys; prints
//     throughput and request latency.
//   - kafka: publishes N distinct stores to --kafka-topic on
//     --kafka-brokers in upstream's record format (one record per batch,
//     keyed by instance_id), as `lmcache server
//     --coordinator-event-transport kafka` does; prints events/s.
//   - fleet: --instances simulated MP servers against --targets: each
//     registers and heartbeats, serves DELETE /cache/objects (a
//     coordinator's evictions) on a loopback listener and streams its
//     store and delete batches to every target's POST /events, or through
//     Kafka with --kafka-brokers; exits once every batch reached every
//     target (plus --hold) and prints what the fleet still stores.
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
	cmd, err := coordload.ParseCommand(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lmcache-coordload: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var res fmt.Stringer
	switch cmd.Mode {
	case coordload.ModeKafka:
		res, err = coordload.RunKafka(ctx, cmd)
	case coordload.ModeFleet:
		res, err = coordload.RunFleet(ctx, cmd)
	default:
		res, err = coordload.Run(ctx, cmd.HTTP, coordload.NewClient(cmd.HTTP.Concurrency))
	}
	fmt.Println(res)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lmcache-coordload: %v\n", err)
		stop()
		os.Exit(1)
	}
}
