package coordinator_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator"
)

// TestStartupResyncStopsAtPageBound: a server whose listing never ends
// (every page hands out a new token) is read for at most
// ceil(entry bound / page size) pages; the resync then stops, keeping the
// keys it recorded, logs a WARN and counts
// lmcache_coordinator_resync_stopped_total{reason="page_limit"}. Before,
// it read every page the server would give (here 100, then a 503; a server
// that never repeats a token kept it going until shutdown).
func TestStartupResyncStopsAtPageBound(t *testing.T) {
	defer coordinator.SetMaxResyncEntries(9)() // pages of 2: 5 pages
	mp := newMP(t)
	for i := 0; i < 100; i++ {
		mp.pages = append(mp.pages, mpPage{entries: []any{entry(fmt.Sprintf("%02x", i), "r", 1)}, next: strp(fmt.Sprintf("T%d", i))})
	}
	c := startCoord(t, resyncConfig(2))
	mp.register(c, "mp-1")
	waitFor(t, "the resync to finish", func() bool { return c.logs.Has("startup resync finished") })
	if n := len(mp.queries()); n != 5 {
		t.Fatalf("%d listing pages read, want 5", n)
	}
	if u := c.usageBytes("r"); u != 5 {
		t.Fatalf("usage %d, want the 5 keys read", u)
	}
	if !c.logs.Has("startup resync stopped at its page bound") {
		t.Errorf("no WARN about the page bound:\n%s", c.logs.String())
	}
	_, raw := c.do("GET", "/metrics", nil)
	for _, want := range []string{`lmcache_coordinator_resync_stopped_total{reason="page_limit"} 1`, `lmcache_coordinator_resync_stopped_total{reason="token_repeated"} 0`} {
		if !strings.Contains(string(raw), want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
}
