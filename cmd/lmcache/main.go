// Command lmcache is a drop-in replacement for LMCache's multiprocess
// KV-cache server and fleet coordinator. This package only wires flags to
// the internal packages; see ARCHITECTURE.md.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// subcommand runs one `lmcache <name>`; it returns the process exit status
// (0 ok, 1 runtime failure, 2 bad usage). ctx is cancelled on SIGINT/SIGTERM.
type subcommand struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// subcommands is filled by init functions of the files that implement them.
var subcommands = map[string]subcommand{}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "lmcache: unknown command %q (want one of %s)\n", args[0], strings.Join(names(), ", "))
		return 2
	}
	return cmd.run(ctx, args[1:], stdout, stderr)
}

func names() []string {
	out := make([]string, 0, len(subcommands))
	for n := range subcommands {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: lmcache <command> [flags]\n\nCommands:")
	for _, n := range names() {
		fmt.Fprintf(w, "  %-12s %s\n", n, subcommands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'lmcache <command> --help' for the flags of a command.")
}
