package e2e

import (
	"testing"
)

// TestServerGCHeapFloor: `lmcache server` with no --gc-heap-floor-mb runs
// with a 64 MiB floor under its Go heap goal: GET /config reports
// gc_heap_floor_mb 64 from the default, and once a collection has run
// /metrics show a percent above GOGC's 100 and a next-GC goal of at least
// 64 MiB and under 128 MiB (the idle server's live heap is a few MiB, so
// the goal sits just above the floor; a floor of 128 MiB or more would put
// it there). With --gc-heap-floor-mb 0 the percent stays 100 after two
// collections. The floor's arithmetic and its effect on the runtime are
// gcfloor's tests'.
func TestServerGCHeapFloor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"default", nil},
		{"0", []string{"--gc-heap-floor-mb", "0"}},
	} {
		httpPort := freePort(t)
		url := "http://127.0.0.1:" + itoa(httpPort)
		args := append([]string{"server", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)), "--l1-size-gb", "0.0625"}, tc.flags...)
		p := start(t, "server-gc-floor-"+tc.name, []string{"GOGC="}, args...)
		waitFor(t, "healthcheck", healthy(url+"/healthcheck"))
		// Scraping allocates, so collections come; the floor's percent is
		// set by a hook that runs after each one.
		if tc.flags != nil {
			waitFor(t, "two GC cycles", func() bool { return scrape(url, "go_gc_duration_seconds_count") >= 2 })
			if got := scrape(url, "go_gc_gogc_percent"); got != 100 {
				t.Fatalf("--gc-heap-floor-mb 0: go_gc_gogc_percent %v, want 100", got)
			}
		} else {
			var cfg struct {
				Sources struct {
					MP map[string]string `json:"mp"`
				} `json:"_sources"`
				MP struct {
					Floor *int `json:"gc_heap_floor_mb"`
				} `json:"mp"`
			}
			if code, _ := call(t, "GET", url+"/config", nil, nil, &cfg); code != 200 || cfg.MP.Floor == nil || *cfg.MP.Floor != 64 || cfg.Sources.MP["gc_heap_floor_mb"] != "default" {
				t.Fatalf("GET /config = %d, gc_heap_floor_mb %v from %q; want 64 from the default", code, cfg.MP.Floor, cfg.Sources.MP["gc_heap_floor_mb"])
			}
			waitFor(t, "the floor's percent", func() bool { return scrape(url, "go_gc_gogc_percent") > 100 })
			if goal := scrape(url, "go_memstats_next_gc_bytes"); goal < 64<<20 || goal >= 128<<20 {
				t.Fatalf("default floor: go_memstats_next_gc_bytes %v, want in [%d, %d)", goal, 64<<20, 128<<20)
			}
		}
		p.Stop(t)
	}
}
