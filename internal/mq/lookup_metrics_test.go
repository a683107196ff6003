package mq_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/mq"
)

// lookupObservations is lmcache_mp_lookup_duration_seconds's sample count
// and sum.
func lookupObservations(t *testing.T, m *mpmetrics.Metrics) (uint64, float64) {
	t.Helper()
	var d dto.Metric
	if err := m.LookupSeconds.WithLabelValues().(prometheus.Metric).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount(), d.GetHistogram().GetSampleSum()
}

// TestZMQLookupObservesDurationHistogram: one LOOKUP over the real socket,
// answered through QUERY_PREFETCH_STATUS, adds exactly one observation to
// lmcache_mp_lookup_duration_seconds (with a positive duration), and
// FREE_LOOKUP_LOCKS adds none.
func TestZMQLookupObservesDurationHistogram(t *testing.T) {
	metrics := mpmetrics.New("i-1", nil)
	h := start(t, opts{mq: func(c *mq.Config) { c.Metrics = metrics }})
	w := h.worker(1, "m", 1, 0)
	data := chunkData{}
	tokens := prompt(11, 2*testChunk)
	w.store(tokens, 0, 2*testChunk, "s", data.of(11, 0))
	// The store may become visible just after its commit: lookups until
	// then are observed too, so the baseline is taken after.
	lookupUntil(t, w.c, key("m", 1, -1, tokens, 0, 2*testChunk, "warm"), 2)
	freeLocks(t, w.c, key("m", 1, -1, tokens, 0, 2*testChunk, "warm"))
	before, sumBefore := lookupObservations(t, metrics)
	if before == 0 {
		t.Fatal("the warm-up lookups were not observed")
	}

	k := key("m", 1, -1, tokens, 0, 2*testChunk, "one")
	if n := lookupOnce(t, w.c, k); n != 2 {
		t.Fatalf("LOOKUP hit %d chunks, want 2", n)
	}
	freeLocks(t, w.c, k)
	after, sumAfter := lookupObservations(t, metrics)
	if after != before+1 {
		t.Fatalf("histogram count %d after one LOOKUP, want %d", after, before+1)
	}
	if sumAfter <= sumBefore {
		t.Fatalf("histogram sum %v after one LOOKUP, want more than %v", sumAfter, sumBefore)
	}
}
