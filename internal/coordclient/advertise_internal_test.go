package coordclient

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/logtest"
)

// TestOutboundProbeFailureWarns: when the probe fails the client logs one
// WARN naming the fallback and the flag (URL password masked) and
// advertises 127.0.0.1.
func TestOutboundProbeFailureWarns(t *testing.T) {
	var logs logtest.Buffer
	c, err := New(Config{URL: "http://ops:pw@coordinator.invalid:9000", HTTPPort: 8080,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := c.advertiseIP(ctx); got != "127.0.0.1" {
		t.Fatalf("advertiseIP = %q, want 127.0.0.1", got)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one log line, got %q", logs.String())
	}
	for _, want := range []string{
		"level=WARN",
		`msg="cannot find the outbound IP toward the coordinator; advertising 127.0.0.1 (set --coordinator-advertise-ip)"`,
		"url=http://ops:xxxxx@coordinator.invalid:9000",
		`err="dial udp coordinator.invalid:9000: `,
	} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("log line %q lacks %q", lines[0], want)
		}
	}
	if strings.Contains(lines[0], "pw@") {
		t.Fatalf("password logged: %q", lines[0])
	}
}
