package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine running (the
// subcommands start servers and loops; their tests must stop them all).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
