package coordclient

import (
	"context"
	"errors"
	"testing"
)

// TestOutboundIPHonoursContext: the outbound-IP probe dials with the
// registrar cycle's context, so a cancelled cycle does not resolve a
// hostname (a name under .invalid, which no resolver may answer, gets
// context.Canceled rather than a DNS verdict) and registration falls back
// to 127.0.0.1; with a live context a literal address needs no DNS and
// yields the loopback source address.
func TestOutboundIPHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ip, err := outboundIP(ctx, "http://coordinator.invalid:9000"); !errors.Is(err, context.Canceled) || ip != "" {
		t.Fatalf("outboundIP with a cancelled ctx = %q, %v; want context.Canceled", ip, err)
	}
	c, err := New(Config{URL: "http://coordinator.invalid:9000", HTTPPort: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.advertiseIP(ctx); got != "127.0.0.1" {
		t.Fatalf("advertiseIP with a cancelled ctx = %q, want the 127.0.0.1 fallback", got)
	}
	if ip, err := outboundIP(context.Background(), "http://127.0.0.1"); err != nil || ip != "127.0.0.1" {
		t.Fatalf("outboundIP toward 127.0.0.1 (port 80 implied) = %q, %v", ip, err)
	}
}
