package coordclient_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordclient"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordtest"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestAuthTokenNeverLogged: with debug logging on, neither the right
// token (registration, heartbeats, an event flush, deregistration) nor a
// wrong one (refused registrations and a refused event flush) appears in
// any log line.
func TestAuthTokenNeverLogged(t *testing.T) {
	const tok, wrong = "tok-right-5ecret", "tok-wrong-5ecret"
	base := coordtest.Start(t, listen(t), func(c *config.Config) { c.AuthToken = tok })
	var logs logtest.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg, badReg := periodic.NewRegistry(), periodic.NewRegistry()
	good, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8080, InstanceID: "mp-good", AuthToken: tok, HeartbeatInterval: 20 * time.Millisecond,
		EventReporting: true, EventFlushInterval: time.Hour, Periodic: reg, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8081, InstanceID: "mp-bad", AuthToken: wrong, HeartbeatInterval: 20 * time.Millisecond,
		EventReporting: true, EventFlushInterval: 20 * time.Millisecond, Periodic: badReg, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	stopGood := runClient(t, good)
	stopBad := runClient(t, bad)
	waitFor(t, "registration and a heartbeat", func() bool {
		st, _ := reg.Get(coordclient.LoopRegistrar)
		return good.Registered() && st.TotalRuns >= 2
	})
	good.OnStored([]objkey.Key{{ChunkHash: "0a", ModelName: "m"}}, []int64{1})
	if err := good.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	bad.OnStored([]objkey.Key{{ChunkHash: "0b", ModelName: "m"}}, []int64{1})
	waitFor(t, "the wrong token's failures to be logged", func() bool {
		return logs.Has("coordinator unreachable; will retry") && logs.Has("coordinator event flush failed; will retry")
	})
	stopGood()
	stopBad()
	out := logs.String()
	for _, want := range []string{"registered with coordinator", "deregistered from coordinator", "coordinator rejected the auth token (401)"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{tok, wrong} {
		if strings.Contains(out, secret) {
			t.Fatalf("token %q logged:\n%s", secret, out)
		}
	}
}

// TestDefaultAdvertiseIPIsOutboundIP: with no AdvertiseIP the client
// registers the source address of the probe toward the coordinator
// (127.0.0.1 toward a loopback coordinator), found without the fallback's
// warning.
func TestDefaultAdvertiseIPIsOutboundIP(t *testing.T) {
	base := coordtest.Start(t, listen(t), nil)
	var logs logtest.Buffer
	c, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8124, InstanceID: "mp-ip", HeartbeatInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := runClient(t, c)
	waitFor(t, "registration", func() bool { return c.Registered() && len(instances(t, base)) == 1 })
	in := instances(t, base)[0]
	if in.InstanceID != "mp-ip" || in.IP != "127.0.0.1" || in.HTTPPort != 8124 {
		t.Fatalf("registered as %+v", in)
	}
	stop()
	if logs.Has("cannot find the outbound IP") {
		t.Fatalf("the probe failed; the IP is the fallback's:\n%s", logs.String())
	}
}

// TestIncarnationIsStartUnixNanos: a client's default incarnation is the
// wall clock at New in Unix nanoseconds (not seconds), bracketed by reads
// of the clock before and after (one nanosecond above the earlier read
// when an earlier client took that very nanosecond).
func TestIncarnationIsStartUnixNanos(t *testing.T) {
	before := time.Now().UnixNano()
	c, err := coordclient.New(coordclient.Config{})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().UnixNano()
	if inc := c.Incarnation(); inc < before || inc > max(after, before+1) {
		t.Fatalf("incarnation %d outside [%d, %d]", inc, before, max(after, before+1))
	}
}

// TestLoopLevels: the reporter loop is listed at level medium, the
// registrar at high.
func TestLoopLevels(t *testing.T) {
	base := coordtest.Start(t, listen(t), nil)
	reg := periodic.NewRegistry()
	c, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8080, AdvertiseIP: "10.0.0.9", EventReporting: true, Periodic: reg,
		HeartbeatInterval: 20 * time.Millisecond, EventFlushInterval: 20 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	waitFor(t, "both loops listed", func() bool {
		_, ok1 := reg.Get(coordclient.LoopReporter)
		_, ok2 := reg.Get(coordclient.LoopRegistrar)
		return ok1 && ok2
	})
	rep, _ := reg.Get(coordclient.LoopReporter)
	rgs, _ := reg.Get(coordclient.LoopRegistrar)
	if rep.Level != "medium" || rgs.Level != "high" {
		t.Fatalf("levels: reporter %q, registrar %q", rep.Level, rgs.Level)
	}
	if coordclient.LoopReporter != "coordinator-event-reporter" || coordclient.LoopRegistrar != "coordinator-registrar" {
		t.Fatalf("loop names %q, %q", coordclient.LoopReporter, coordclient.LoopRegistrar)
	}
}
