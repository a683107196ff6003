package mpmetrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
)

// TestBuildInfoScraped: GET /metrics serves lmcache_mp_build_info with the
// build's version, revision and modified labels, value 1.
func TestBuildInfoScraped(t *testing.T) {
	body := scrapeNew(t)
	l := buildinfo.Labels()
	want := `lmcache_mp_build_info{modified="` + l["modified"] + `",revision="` + l["revision"] + `",version="` + l["version"] + `"} 1`
	if !strings.Contains(body, want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}

// TestTraceSpansDroppedStartAtZero: GET /metrics serves every reason of
// lmcache_mp_trace_spans_dropped_total at 0 before any span was lost, so
// a dashboard or alert sees the series from start.
func TestTraceSpansDroppedStartAtZero(t *testing.T) {
	body := scrapeNew(t)
	for _, reason := range []string{"export_failed", "queue_full", "shutdown"} {
		if want := `lmcache_mp_trace_spans_dropped_total{reason="` + reason + `"} 0` + "\n"; !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// scrapeNew is GET /metrics of a fresh Metrics.
func scrapeNew(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(New("inst", nil).Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}
