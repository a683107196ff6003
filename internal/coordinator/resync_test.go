package coordinator_test

import (
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

func entry(hash, salt string, size any) map[string]any {
	return map[string]any{"key": rkey(hash, salt), "size_bytes": size, "adapter": "fs"}
}

func strp(s string) *string { return &s }

func resyncConfig(pageSize int) func(*config.Config) {
	return func(cfg *config.Config) {
		cfg.EnableStartupResync = true
		cfg.ResyncPollInterval = 0.01
		cfg.ResyncMaxWait = 10
		cfg.ResyncPageSize = pageSize
	}
}

func (m *mpServer) queries() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, q := range m.listQueries {
		out = append(out, q.Encode())
	}
	return out
}

// TestStartupResyncPaginates: the resync waits for the first server, then
// walks its GET /cache/objects pages forwarding page tokens verbatim, and
// seeds usage and LRU order (listing order) from the entries.
func TestStartupResyncPaginates(t *testing.T) {
	mp := newMP(t)
	mp.pages = []mpPage{
		{entries: []any{entry("01", "r", 100), entry("02", "r", 100)}, next: strp("T1")},
		{entries: []any{entry("03", "r", 100)}, next: strp("T2")},
		{entries: []any{entry("04", "q", 60)}, next: nil},
	}
	c := startCoord(t, resyncConfig(2))
	waitFor(t, "the resync to poll an empty registry", func() bool { return c.logs.Has("startup resync waiting for the first MP server") })
	mp.register(c, "mp-1")
	waitFor(t, "resync to finish", func() bool {
		_, raw := c.do("GET", "/metrics", nil)
		return strings.Contains(string(raw), "lmcache_coordinator_resync_keys_total 4")
	})
	if q := strings.Join(mp.queries(), " "); q != "page_size=2 page_size=2&page_token=T1 page_size=2&page_token=T2" {
		t.Fatalf("queries %s", q)
	}
	if u := c.usageBytes("r"); u != 300 {
		t.Fatalf("usage r %d", u)
	}
	if u := c.usageBytes("q"); u != 60 {
		t.Fatalf("usage q %d", u)
	}
	_, raw := c.do("GET", "/metrics", nil)
	if !strings.Contains(string(raw), "lmcache_coordinator_resync_pages_total 3") {
		t.Fatalf("pages metric:\n%s", raw)
	}
	// Listing order is LRU order.
	c.must("PUT", "/quota/r", map[string]any{"limit_gb": 0}, 200)
	c.cycle()
	if got := strings.Join(hexes(mp.deleteBatches()[0]), ","); got != "r/01,r/02,r/03" {
		t.Fatalf("plan after resync %s", got)
	}
}

// TestStartupResyncSkipsMalformedAndKeepsPartial: malformed entries are
// skipped, and a failing second page ends the walk keeping page one.
func TestStartupResyncSkipsMalformedAndKeepsPartial(t *testing.T) {
	mp := newMP(t)
	bad := entry("05", "r", 1)
	bad["key"].(map[string]any)["model_name"] = "m@x"
	noSize := entry("06", "r", nil)
	delete(noSize, "size_bytes")
	mp.pages = []mpPage{
		{entries: []any{entry("01", "r", 50), bad, entry("zz", "r", 7), noSize, entry("07", "r", "25"), entry("08", "bad/salt", 9), "junk"}, next: strp("T1")},
		{entries: []any{entry("09", "r", 1000)}, next: nil},
	}
	mp.failPage = 2
	c := startCoord(t, resyncConfig(1000))
	mp.register(c, "mp-1")
	waitFor(t, "two list requests", func() bool { return len(mp.queries()) == 2 })
	waitFor(t, "page one recorded", func() bool { return c.usageBytes("r") == 75 })
	if q := mp.queries()[0]; q != "page_size=1000" {
		t.Fatalf("default page size query %s", q)
	}
	// The five unusable entries of page one are counted, not silently lost.
	if _, raw := c.do("GET", "/metrics", nil); !strings.Contains(string(raw), "lmcache_coordinator_resync_entries_skipped_total 5\n") {
		t.Fatal("skipped entries not counted as 5")
	}
}

// TestStartupResyncStopsOnRepeatedToken: a server that hands back a token
// it gave before would page forever, re-storing the same keys, until
// shutdown: the token it was just given, or one of a cycle (T1, T2, T1,
// ...). The resync stops at the first repeated token and keeps what it
// recorded.
func TestStartupResyncStopsOnRepeatedToken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []string // of the pages served, in order; "" ends the listing
		want   string   // the queries the resync sends
	}{
		{"same token", []string{"T1", "T1", ""}, "page_size=1000 page_size=1000&page_token=T1"},
		{"cycle", []string{"T1", "T2", "T1", "T2", "T1", "T2", ""}, "page_size=1000 page_size=1000&page_token=T1 page_size=1000&page_token=T2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp := newMP(t)
			for i, tok := range tc.tokens {
				p := mpPage{entries: []any{entry(fmt.Sprintf("%02x", i%2+1), "r", 5+2*(i%2))}}
				if tok != "" {
					p.next = strp(tok)
				}
				mp.pages = append(mp.pages, p)
			}
			c := startCoord(t, resyncConfig(1000))
			mp.register(c, "mp-1")
			waitFor(t, "the resync to finish", func() bool { return c.logs.Has("startup resync finished") })
			if q := strings.Join(mp.queries(), " "); q != tc.want {
				t.Fatalf("queries %s, want %s", q, tc.want)
			}
			if u := c.usageBytes("r"); u != 12 {
				t.Fatalf("usage %d, want the two keys read (12)", u)
			}
			metric(t, c, `lmcache_coordinator_resync_stopped_total{reason="token_repeated"} 1`)
		})
	}
}

// TestStartupResyncRefusesKeysDeletedMeanwhile: the server read a page,
// then deleted one of its keys, and the delete event reached the
// coordinator before the page. The resync does not store that key again.
// Before, it did, and the key stayed in the ledger (and its salt's usage)
// for good: no delete event for it comes again.
func TestStartupResyncRefusesKeysDeletedMeanwhile(t *testing.T) {
	mp := newMP(t)
	mp.pages = []mpPage{{entries: []any{entry("01", "r", 100), entry("02", "r", 50)}}}
	c := startCoord(t, resyncConfig(1000))
	deleted := make(chan int, 1)
	mp.onList = func(int) {
		code, _ := c.do("POST", "/quota/events", map[string]any{"instance_id": "mp-1", "seq": 1, "events": []any{rev("delete", "01", "r", 0)}})
		deleted <- code
	}
	mp.register(c, "mp-1")
	waitFor(t, "the resync to finish", func() bool { return c.logs.Has("startup resync finished") })
	select {
	case code := <-deleted:
		if code != 200 {
			t.Fatalf("delete event = %d", code)
		}
	default: // the page was served, so onList has run
		t.Fatal("the fake server never listed")
	}
	if u := c.usageBytes("r"); u != 50 {
		t.Fatalf("usage %d, want 50 (02 alone)", u)
	}
	metric(t, c, "lmcache_coordinator_resync_keys_total 1")
	metric(t, c, "lmcache_coordinator_resync_entries_superseded_total 1")
	// After the resync a store of the key counts again.
	c.events(rev("store", "01", "r", 100))
	if u := c.usageBytes("r"); u != 150 {
		t.Fatalf("usage after a new store %d, want 150", u)
	}
}

// TestStartupResyncClampsPageSize: RESYNC_PAGE_SIZE above the server's
// 5000 ceiling is clamped instead of failing the whole resync, with one
// warning naming the configured and the used size; 5000 itself is sent as
// configured, without the warning.
func TestStartupResyncClampsPageSize(t *testing.T) {
	const clamped = "RESYNC_PAGE_SIZE above the MP server's maximum; clamped"
	for _, cs := range []struct {
		configured int
		warned     bool
	}{{9000, true}, {5001, true}, {5000, false}} {
		t.Run(fmt.Sprint(cs.configured), func(t *testing.T) {
			mp := newMP(t)
			mp.pages = []mpPage{{entries: []any{entry("01", "r", 5)}}}
			c, recs := startCoordRecorded(t, resyncConfig(cs.configured))
			mp.register(c, "mp-1")
			waitFor(t, "the resync to finish", func() bool { return c.logs.Has("startup resync finished") })
			if q := strings.Join(mp.queries(), " "); q != "page_size=5000" {
				t.Fatalf("queries %s, want one page of 5000", q)
			}
			if u := c.usageBytes("r"); u != 5 {
				t.Fatalf("usage %d, want the page read (5)", u)
			}
			got := recs.withMsg(clamped)
			if !cs.warned {
				if len(got) != 0 {
					t.Fatalf("page size 5000 warned: %+v", got)
				}
				return
			}
			want := logRecord{Level: slog.LevelWarn, Msg: clamped, Attrs: map[string]string{"component": "coordinator", "configured": fmt.Sprint(cs.configured), "used": "5000"}}
			if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Fatalf("clamp records %+v, want exactly %+v", got, want)
			}
		})
	}
}

// TestStartupResyncDisabledOrGivesUp: ENABLE_STARTUP_RESYNC=False never
// lists; with RESYNC_MAX_WAIT=0 and no server the resync gives up at once,
// and a server registering afterwards is not listed.
func TestStartupResyncDisabledOrGivesUp(t *testing.T) {
	t.Run("max wait 0", func(t *testing.T) {
		mp := newMP(t)
		mp.pages = []mpPage{{entries: []any{entry("01", "r", 5)}}}
		c := startCoord(t, func(cfg *config.Config) {
			cfg.EnableStartupResync = true
			cfg.ResyncMaxWait = 0
		})
		waitFor(t, "the resync to give up", func() bool { return c.logs.Has("startup resync giving up") })
		mp.register(c, "mp-1")
		if q := mp.queries(); len(q) != 0 {
			t.Fatalf("listed after giving up: %v", q)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		mp := newMP(t)
		mp.pages = []mpPage{{entries: []any{entry("01", "r", 5)}}}
		c := startCoord(t, func(cfg *config.Config) {
			cfg.EnableStartupResync = false
			cfg.ResyncPollInterval = 0.01
			cfg.EvictionCheckInterval = 0.01
		})
		mp.register(c, "mp-1")
		// The resync loop is never registered, and a wrong one would have
		// had ten poll intervals to list by the time the eviction loop (same
		// interval) has run ten cycles. Then Run is stopped, so no loop can
		// list afterwards either.
		waitFor(t, "ten eviction cycles", func() bool { return c.threads()[coordinator.LoopEviction].TotalRuns >= 10 })
		if th := c.threads(); len(th) != 2 || th[coordinator.LoopLedgerReserve].Name == "" {
			t.Fatalf("loops with the resync disabled: %v, want only eviction and the ledger reserve", th)
		}
		c.stop()
		if err := c.wait(); err != nil {
			t.Fatal(err)
		}
		if q := mp.queries(); len(q) != 0 || c.logs.Has("startup resync") {
			t.Fatalf("listed with the resync disabled: %v", q)
		}
	})
}
