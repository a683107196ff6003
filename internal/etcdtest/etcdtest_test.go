package etcdtest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/proctest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// takenOnce hands out a port another listener holds on its first call (the
// race FreePort cannot close: the port is taken between the probe and
// etcd's bind), then real free ports.
type takenOnce struct {
	held  net.Listener
	calls int
}

// newTakenOnce holds a port until the test ends and hands it out first.
func newTakenOnce(t *testing.T) *takenOnce {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &takenOnce{held: ln}
}

func (p *takenOnce) pick(t testing.TB) int {
	p.calls++
	if p.calls == 1 {
		return p.held.Addr().(*net.TCPAddr).Port
	}
	return proctest.FreePort(t)
}

// A member whose peer port is taken exits; Start retries on fresh ports and
// returns a cluster that answers, instead of waiting out the health
// deadline on a dead member.
func TestStartRetriesATakenPort(t *testing.T) {
	p := newTakenOnce(t)
	c := startPicking(t, 1, p.pick)
	if p.calls != 4 {
		t.Errorf("ports picked: %d, want 4 (two per attempt, two attempts)", p.calls)
	}
	cli := NewClient(t, c.Endpoints)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put on the retried cluster: %v", err)
	}
}

// The first attempt's failure names the port race, so a retry is only for
// that cause.
func TestStartReportsPortTaken(t *testing.T) {
	p := newTakenOnce(t)
	c, err := start(t, 1, p.pick)
	for _, m := range c.Members {
		m.Kill(t)
	}
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("start on a taken peer port: %v, want %q", err, errPortTaken)
	}
}
