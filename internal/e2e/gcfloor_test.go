package e2e

import (
	"testing"
)

// TestServerGCHeapFloor: `lmcache server` runs with a 64 MiB floor under
// its Go heap goal (--gc-heap-floor-mb's default): once a collection has
// run, /metrics show a percent above GOGC's 100 and a next-GC goal of at
// least 64 MiB; with --gc-heap-floor-mb 0 the percent stays 100 after two
// collections. The floor's arithmetic and its effect on the runtime are
// gcfloor's tests'.
func TestServerGCHeapFloor(t *testing.T) {
	for _, floorMB := range []string{"64", "0"} {
		httpPort := freePort(t)
		url := "http://127.0.0.1:" + itoa(httpPort)
		p := start(t, "server-gc-floor-"+floorMB, []string{"GOGC="}, "server", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)),
			"--l1-size-gb", "0.0625", "--gc-heap-floor-mb", floorMB)
		waitFor(t, "healthcheck", healthy(url+"/healthcheck"))
		// Scraping allocates, so collections come; the floor's percent is
		// set by a hook that runs after each one.
		if floorMB == "0" {
			waitFor(t, "two GC cycles", func() bool { return scrape(url, "go_gc_duration_seconds_count") >= 2 })
			if got := scrape(url, "go_gc_gogc_percent"); got != 100 {
				t.Fatalf("--gc-heap-floor-mb 0: go_gc_gogc_percent %v, want 100", got)
			}
		} else {
			waitFor(t, "the floor's percent", func() bool { return scrape(url, "go_gc_gogc_percent") > 100 })
			if goal := scrape(url, "go_memstats_next_gc_bytes"); goal < 64<<20 {
				t.Fatalf("floor 64 MiB: go_memstats_next_gc_bytes %v, want at least %d", goal, 64<<20)
			}
		}
		p.Stop(t)
	}
}
