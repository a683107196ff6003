package periodic

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestCollectorStuckLoop runs two worker loops whose first cycle succeeds
// and whose second never returns; ten (fake) seconds later the loop with a
// 2 s interval is reported unhealthy and the one with a 1 h interval
// healthy, both 10 s since their last success. A registered loop that is
// not running is healthy with 0.
func TestCollectorStuckLoop(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	r := NewRegistry()
	r.SetClock(clk.now)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, c := range []struct {
		name     string
		interval time.Duration
	}{{"stuck", 2 * time.Second}, {"slow", time.Hour}} {
		entered := make(chan struct{})
		calls := 0
		l := r.RegisterWorker(c.name, High, c.interval, func(ctx context.Context) (Summary, error) {
			calls++
			if calls == 1 {
				return Summary{}, nil
			}
			close(entered)
			<-ctx.Done()
			return Summary{}, ctx.Err()
		})
		wg.Add(1)
		go func() { defer wg.Done(); l.Run(ctx) }()
		select { // the second cycle started: the first was recorded
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("loop %s never started its second cycle", c.name)
		}
	}
	r.Register("idle", Low, time.Second, 0, func(context.Context) (Summary, error) { return Summary{}, nil })
	clk.add(10 * time.Second)
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.Collector("lmcache_mp"))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			lv := map[string]string{}
			for _, p := range m.GetLabel() {
				lv[p.GetName()] = p.GetValue()
			}
			got[f.GetName()+"{"+lv["name"]+","+lv["level"]+"}"] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"lmcache_mp_periodic_thread_healthy{stuck,high}":               0,
		"lmcache_mp_periodic_thread_healthy{slow,high}":                1,
		"lmcache_mp_periodic_thread_healthy{idle,low}":                 1,
		"lmcache_mp_periodic_thread_seconds_since_success{stuck,high}": 10,
		"lmcache_mp_periodic_thread_seconds_since_success{slow,high}":  10,
		"lmcache_mp_periodic_thread_seconds_since_success{idle,low}":   0,
	}
	if len(got) != len(want) {
		t.Fatalf("gathered %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}
