package tracing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lmcache-go/lmcache/internal/tracing"
)

// TestEnableWithoutEndpointOneLine: --enable-tracing without
// --otlp-endpoint fails Start with exactly this one line (cmd/lmcache's
// newServer wraps a Start error as a usage error: printed once after
// "lmcache server: ", exit 2), whatever the level.
func TestEnableWithoutEndpointOneLine(t *testing.T) {
	const want = "--enable-tracing requires --otlp-endpoint (an OTLP gRPC endpoint such as http://localhost:4317)"
	for _, level := range []string{"", "storage", "events"} {
		p, err := tracing.Start(context.Background(), tracing.Config{Enabled: true, Level: level})
		if !errors.Is(err, tracing.ErrNoEndpoint) || err.Error() != want {
			t.Errorf("level %q: err %v, want %q", level, err, want)
		}
		if p != nil {
			t.Errorf("level %q: a provider with the error", level)
		}
	}
}
