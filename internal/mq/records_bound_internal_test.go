package mq

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lmcache-go/lmcache/internal/mpmetrics"
)

// TestRequestRecordsBounded: the no-job marks and the running lookups'
// metadata stop at maxRequestRecords entries: each new id past that drops
// one older record, counted by kind; an id already recorded is updated in
// place and drops nothing.
func TestRequestRecordsBounded(t *testing.T) {
	s := &Server{cfg: Config{ChunkSize: 16}, log: slog.New(slog.DiscardHandler), metrics: mpmetrics.New("", nil)}
	st := newState(s)
	st.mu.Lock()
	for i := range maxRequestRecords + 3 {
		id := "r" + strconv.Itoa(i)
		st.markNoJobLocked(id)
		st.recordLookupLocked(id, lookupMeta{model: "m", chunks: 1, started: time.Now()})
	}
	last := "r" + strconv.Itoa(maxRequestRecords+2) // recorded last, so still there
	st.markNoJobLocked(last)
	st.recordLookupLocked(last, lookupMeta{})
	noJob, lookups := len(st.noJob), len(st.lookups)
	st.mu.Unlock()
	if noJob != maxRequestRecords || lookups != maxRequestRecords {
		t.Fatalf("%d no-job marks, %d lookup records after %d ids; want %d each", noJob, lookups, maxRequestRecords+3, maxRequestRecords)
	}
	dropped := s.metrics.ZMQDroppedRecords
	value := func(kind string) float64 {
		var m dto.Metric
		if err := dropped.WithLabelValues(kind).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	nj, lk := value("no_job"), value("lookup")
	if nj != 3 || lk != 3 {
		t.Fatalf("dropped records: no_job %v, lookup %v; want 3 each (the last id recorded again drops nothing)", nj, lk)
	}
}
