package mq

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestReceiveFailureCountedAndRateLimited: a ROUTER receive error other
// than EAGAIN (a real one of the library: the socket is closed) loses
// whatever message it was, so each is counted under
// lmcache_mp_zmq_malformed_messages_total{kind="receive_failed"}, while
// the warning is logged once per protocolWarnEvery.
func TestReceiveFailureCountedAndRateLimited(t *testing.T) {
	s := unrunServer(t, Config{})
	logs := &logtest.Buffer{}
	s.st.log = slog.New(slog.NewTextHandler(logs, nil))
	if err := s.router.Close(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		s.drainRequests()
	}
	if got := malformedCount(t, s, "receive_failed"); got != 5 {
		t.Errorf("receive failures counted %v, want 5", got)
	}
	for _, kind := range []string{"frames", "op_frame", "unknown_op", "payload_count", "payload"} {
		if got := malformedCount(t, s, kind); got != 0 {
			t.Errorf("malformed{kind=%s} = %v, want 0", kind, got)
		}
	}
	if n := strings.Count(logs.String(), "ROUTER receive failed"); n != 1 {
		t.Errorf("receive failure logged %d times, want 1:\n%s", n, logs.String())
	}
}

// malformedCount is lmcache_mp_zmq_malformed_messages_total{kind}.
func malformedCount(t *testing.T, s *Server, kind string) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.metrics.ZMQMalformed.WithLabelValues(kind).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestSocketWatchTurnsUnhealthyWhenWedged: the socket goroutine's watch is
// a high-level periodic loop. While the (simulated) router loop iterates
// every pollInterval, each watch cycle ends at its first check and the
// loop stays active; once the iterations stop, the cycle never ends and
// after three intervals /periodic-threads-health's list names the loop.
// synctest's clock makes the run counts exact.
func TestSocketWatchTurnsUnhealthyWhenWedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := periodic.NewRegistry()
		var w socketWatch
		l := w.register(reg)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { l.Run(ctx) })
		wedge := make(chan struct{})
		wg.Go(func() {
			var iter uint64
			for {
				iter++
				w.beats.Store(iter)
				select {
				case <-wedge:
					return
				case <-ctx.Done():
					return
				case <-time.After(pollInterval):
				}
			}
		})
		unhealthy := func() []string {
			var names []string
			for _, s := range periodic.Unhealthy(reg.All()) {
				names = append(names, s.Name)
			}
			return names
		}
		// Cycles start at 0 s, 1 s, ... and each ends one second later.
		time.Sleep(5*socketWatchEvery + socketWatchEvery/2)
		synctest.Wait()
		st, _ := reg.Get(socketLoopName)
		if st.TotalRuns != 5 || st.FailedRuns != 0 || !st.IsActive || st.Level != periodic.High || len(unhealthy()) != 0 {
			t.Fatalf("iterating: %+v, unhealthy %v; want 5 runs, active", st, unhealthy())
		}
		// Wedge at 5.5 s: the cycle begun at 5 s still sees the iterations
		// before, the one begun at 6 s never ends, and from 9 s (three
		// intervals after its start) the loop is inactive.
		close(wedge)
		time.Sleep(4 * socketWatchEvery)
		synctest.Wait()
		st, _ = reg.Get(socketLoopName)
		if got := unhealthy(); st.TotalRuns != 6 || st.IsActive || len(got) != 1 || got[0] != socketLoopName {
			t.Fatalf("wedged: %+v, unhealthy %v; want 6 runs, inactive, listed", st, got)
		}
		cancel()
		wg.Wait()
	})
}
