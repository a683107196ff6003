package coordinator

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// thresholdCollector exports, for the salts lmcache_coordinator_salt_usage_bytes
// lists (the top --metrics-top-salts by tracked bytes) that have a limit
// (their quota or the default), the usage at which the eviction planner
// starts evicting them: trigger_watermark × limit (ledger.ComputePlan's
// rule, as GET /ui/api/fleet's eviction_starts_bytes). A salt whose usage
// stays at or above it is one eviction is not keeping up with
// (deploy/prometheus's LMCacheSaltAboveEvictionWatermark).
type thresholdCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newThresholdCollector(s *Server) *thresholdCollector {
	return &thresholdCollector{s: s, desc: prometheus.NewDesc(metricPrefix+"salt_eviction_threshold_bytes",
		"Tracked L2 bytes at which eviction starts for a salt (trigger_watermark x its quota or the default limit), for the salts salt_usage_bytes lists that have a limit.",
		[]string{"cache_salt"}, nil)}
}

func (c *thresholdCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *thresholdCollector) Collect(ch chan<- prometheus.Metric) {
	top := c.s.cfg.MetricsTopSalts
	if top <= 0 {
		return
	}
	usage, _ := c.s.ledger.Usage()
	salts := make([]string, 0, len(usage))
	for k := range usage {
		salts = append(salts, k)
	}
	// The same order and cut as saltCollector, so both families name
	// the same salts and join one to one.
	sort.Slice(salts, func(i, j int) bool {
		if usage[salts[i]] != usage[salts[j]] {
			return usage[salts[i]] > usage[salts[j]]
		}
		return salts[i] < salts[j]
	})
	if len(salts) > top {
		salts = salts[:top]
	}
	limits := c.s.quotas.Snapshot()
	for _, salt := range salts {
		if lim, ok := limits.Effective(salt); ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, c.s.cfg.TriggerWatermark*float64(lim), salt)
		}
	}
}
