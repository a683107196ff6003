package periodic

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the registry's loops as gauges at scrape time.
type collector struct {
	r              *Registry
	healthy, since *prometheus.Desc
}

// Collector returns a Prometheus collector of every registered loop, named
// under namespace (lmcache_mp on the server, lmcache_coordinator on the
// coordinator), labelled {name, level}:
//
//   - <namespace>_periodic_thread_healthy: 0 while the loop runs but has not
//     completed a cycle within three intervals (upstream's "running and not
//     active"), else 1;
//   - <namespace>_periodic_thread_seconds_since_success: seconds since the
//     start of the loop's last successful cycle (since the loop started
//     when none succeeded yet; 0 for a loop that is not running).
//
// Upstream exports no periodic-thread metric (only /periodic-threads); these
// are Go additions for the stuck-loop alert.
func (r *Registry) Collector(namespace string) prometheus.Collector {
	labels := []string{"name", "level"}
	return &collector{r: r,
		healthy: prometheus.NewDesc(namespace+"_periodic_thread_healthy",
			"1 unless the periodic loop runs but has not completed a cycle within 3 intervals (0: stuck).", labels, nil),
		since: prometheus.NewDesc(namespace+"_periodic_thread_seconds_since_success",
			"Seconds since the periodic loop's last successful cycle started (since it started if none succeeded; 0 when not running).", labels, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.since
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.r.mu.Lock()
	loops := make([]*Loop, 0, len(c.r.loops))
	for _, l := range c.r.loops {
		loops = append(loops, l)
	}
	c.r.mu.Unlock()
	for _, l := range loops {
		st := l.Status()
		healthy := 1.0
		if st.IsRunning && !st.IsActive {
			healthy = 0
		}
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, healthy, st.Name, string(st.Level))
		ch <- prometheus.MustNewConstMetric(c.since, prometheus.GaugeValue, l.sinceSuccess().Seconds(), st.Name, string(st.Level))
	}
}
