package coordinator_test

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
)

// TestBuildInfoMetric: the coordinator's GET /metrics names its build in
// lmcache_coordinator_build_info{modified,revision,version} 1.
func TestBuildInfoMetric(t *testing.T) {
	c := startCoord(t, nil)
	_, raw := c.do("GET", "/metrics", nil)
	l := buildinfo.Labels()
	want := `lmcache_coordinator_build_info{modified="` + l["modified"] + `",revision="` + l["revision"] + `",version="` + l["version"] + `"} 1`
	if !strings.Contains(string(raw), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}
