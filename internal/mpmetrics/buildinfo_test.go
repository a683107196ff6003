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
	m := New("inst", nil)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	l := buildinfo.Labels()
	want := `lmcache_mp_build_info{modified="` + l["modified"] + `",revision="` + l["revision"] + `",version="` + l["version"] + `"} 1`
	if !strings.Contains(string(body), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}
