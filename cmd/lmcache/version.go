package main

import (
	"context"
	"fmt"
	"io"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
)

func init() {
	subcommands["version"] = subcommand{"print the version and commit", runVersion}
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "lmcache version: unexpected argument %q\n", args[0])
		return 2
	}
	fmt.Fprintln(stdout, buildinfo.Combined())
	return 0
}
