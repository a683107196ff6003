package coordinator_test

import (
	"encoding/json"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// consoleView is GET /ui/api/fleet as the console reads it.
type consoleView struct {
	Now              float64 `json:"now"`
	InstanceTimeout  float64 `json:"instance_timeout"`
	TriggerWatermark float64 `json:"trigger_watermark"`
	Instances        []struct {
		InstanceID          string  `json:"instance_id"`
		LastHeartbeatTime   float64 `json:"last_heartbeat_time"`
		HeartbeatAgeSeconds float64 `json:"heartbeat_age_seconds"`
		L1Reported          bool    `json:"l1_reported"`
	} `json:"instances"`
	Salts []struct {
		CacheSalt           string `json:"cache_salt"`
		LimitSource         string `json:"limit_source"`
		LimitBytes          *int64 `json:"limit_bytes"`
		UsageBytes          int64  `json:"usage_bytes"`
		EvictionStartsBytes *int64 `json:"eviction_starts_bytes"`
		OverWatermark       bool   `json:"over_watermark"`
	} `json:"salts"`
	ActivePins int `json:"active_pins"`
	Prefetches struct {
		InFlight int `json:"in_flight"`
		Jobs     []struct {
			InstanceID string `json:"instance_id"`
			RequestID  string `json:"request_id"`
		} `json:"jobs"`
		Submitted, Completed, Forgotten int64
	} `json:"prefetches"`
}

func (c *coord) console() consoleView {
	c.t.Helper()
	code, _, raw := c.doAuth("GET", "/ui/api/fleet", nil, "") // open: no token

	if code != 200 {
		c.t.Fatalf("GET /ui/api/fleet = %d %s", code, raw)
	}
	var v consoleView
	if err := json.Unmarshal(raw, &v); err != nil {
		c.t.Fatalf("%s: %v", raw, err)
	}
	return v
}

// TestConsoleFleetView: GET /ui/api/fleet reports each instance's last
// heartbeat (the same instant GET /instances reports, moving on a
// heartbeat), per salt the limit in force and where it comes from, the
// usage and the watermark level where eviction starts (0.5 × limit here)
// with whether usage reached it, and the warm prefetches relayed through
// the coordinator until a poll sees them completed or 404. It is open even
// with --auth-token, like the coordinator's other reads.
func TestConsoleFleetView(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.TriggerWatermark = 0.5; cfg.AuthToken = "tok-console" })
	mp := newMP(t)
	mp.register(c, "mp-1")
	v := c.console()
	if len(v.Instances) != 1 || v.Instances[0].InstanceID != "mp-1" || v.InstanceTimeout != 30 || v.TriggerWatermark != 0.5 {
		t.Fatalf("view %+v", v)
	}
	var inst struct {
		Instances []struct {
			InstanceID        string  `json:"instance_id"`
			RegistrationTime  float64 `json:"registration_time"`
			LastHeartbeatTime float64 `json:"last_heartbeat_time"`
		} `json:"instances"`
	}
	_, raw := c.do("GET", "/instances", nil)
	if err := json.Unmarshal(raw, &inst); err != nil || len(inst.Instances) != 1 {
		t.Fatalf("GET /instances %s: %v", raw, err)
	}
	first := inst.Instances[0]
	// The age comes from the monotonic clock, now and the registration time
	// from the wall clock as float seconds: allow 1 ms for the two to differ.
	if first.LastHeartbeatTime != first.RegistrationTime || v.Instances[0].LastHeartbeatTime != first.LastHeartbeatTime ||
		v.Instances[0].HeartbeatAgeSeconds < 0 || v.Instances[0].HeartbeatAgeSeconds > v.Now-first.RegistrationTime+1e-3 {
		t.Fatalf("registration heartbeat: /instances %+v, console %+v (now %v)", first, v.Instances[0], v.Now)
	}
	waitFor(t, "the clock to move", func() bool { return c.console().Now > first.LastHeartbeatTime })
	c.must("PUT", "/instances/mp-1/heartbeat", nil, 200)
	_, raw = c.do("GET", "/instances", nil)
	if err := json.Unmarshal(raw, &inst); err != nil {
		t.Fatal(err)
	}
	if inst.Instances[0].LastHeartbeatTime <= first.LastHeartbeatTime || c.console().Instances[0].LastHeartbeatTime != inst.Instances[0].LastHeartbeatTime {
		t.Fatalf("after the heartbeat: /instances %+v (was %v)", inst.Instances[0], first.LastHeartbeatTime)
	}

	// Salts: "a" over its watermark, "b" under, "c" only on the default
	// limit, "d" exempt until a default is set.
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 1.0 / (1 << 20)}, 200) // 1 KiB
	c.must("PUT", "/quota/b", map[string]any{"limit_gb": 4.0 / (1 << 20)}, 200) // 4 KiB
	c.must("POST", "/quota/events", map[string]any{"instance_id": "i1", "seq": 1, "events": []any{
		ev("store", "aa01", "a", 600), ev("store", "bb01", "b", 1000), ev("store", "cc01", "c", 300)}}, 200)
	type row struct {
		src                  string
		limit, usage, starts int64
		over                 bool
	}
	check := func(want map[string]row) {
		t.Helper()
		got := map[string]row{}
		for _, s := range c.console().Salts {
			r := row{src: s.LimitSource, usage: s.UsageBytes, over: s.OverWatermark, limit: -1, starts: -1}
			if s.LimitBytes != nil {
				r.limit = *s.LimitBytes
			}
			if s.EvictionStartsBytes != nil {
				r.starts = *s.EvictionStartsBytes
			}
			got[s.CacheSalt] = r
		}
		if len(got) != len(want) {
			t.Fatalf("salts %+v, want %+v", got, want)
		}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("salt %q: %+v, want %+v", k, got[k], w)
			}
		}
	}
	check(map[string]row{"a": {"quota", 1024, 600, 512, true}, "b": {"quota", 4096, 1000, 2048, false}, "c": {"none", -1, 300, -1, false}})
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 0.5 / (1 << 20)}, 200) // 512 B
	check(map[string]row{"a": {"quota", 1024, 600, 512, true}, "b": {"quota", 4096, 1000, 2048, false}, "c": {"default", 512, 300, 256, true}})

	// Prefetches: a submit is in flight until its poll says completed.
	body := map[string]any{"instance_id": "mp-1", "model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5}}
	mp.mu.Lock()
	mp.statusBody = `{"status":"pending","request_id":"abc"}`
	mp.mu.Unlock()
	c.must("POST", "/cache/prefetches", body, 200)
	c.must("GET", "/cache/prefetches/mp-1/abc", nil, 200)
	p := c.console().Prefetches
	if p.InFlight != 1 || len(p.Jobs) != 1 || p.Jobs[0].InstanceID != "mp-1" || p.Jobs[0].RequestID != "abc" || p.Submitted != 1 || p.Completed != 0 {
		t.Fatalf("after submit and a pending poll: %+v", p)
	}
	mp.mu.Lock()
	mp.statusBody = `{"status":"completed","found_keys":2,"total_keys":2}`
	mp.mu.Unlock()
	c.must("GET", "/cache/prefetches/mp-1/abc", nil, 200)
	if p := c.console().Prefetches; p.InFlight != 0 || len(p.Jobs) != 0 || p.Submitted != 1 || p.Completed != 1 {
		t.Fatalf("after the completed poll: %+v", p)
	}
	// A second job ends with the server's 404; a noop submit is not tracked.
	mp.mu.Lock()
	mp.submitBody = `{"request_id":"def","chunks":2,"status":"submitted"}`
	mp.mu.Unlock()
	c.must("POST", "/cache/prefetches", body, 200)
	mp.mu.Lock()
	mp.statusCode, mp.statusBody = 404, `{"detail":"unknown request_id"}`
	mp.submitBody = `{"chunks":0,"status":"noop"}`
	mp.mu.Unlock()
	if p := c.console().Prefetches; p.InFlight != 1 || p.Jobs[0].RequestID != "def" {
		t.Fatalf("second job: %+v", p)
	}
	c.must("GET", "/cache/prefetches/mp-1/def", nil, 404)
	c.must("POST", "/cache/prefetches", body, 200)
	if p := c.console().Prefetches; p.InFlight != 0 || p.Submitted != 2 || p.Completed != 2 || p.Forgotten != 0 {
		t.Fatalf("after the 404 and a noop: %+v", p)
	}

	// Pins show as active_pins.
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}, "cache_salt": "a"}, 200)
	if n := c.console().ActivePins; n != 1 {
		t.Fatalf("active_pins = %d, want 1", n)
	}
}

// TestConsoleFleetL1Reported: l1_reported tells an instance that never
// posted a tier "l1" fact (GET /instances reads 0 bytes for it) from one
// whose L1 facts are on record; deleting every key keeps it reported at 0
// bytes, and a new incarnation's fence without L1 facts makes it
// unreported again.
func TestConsoleFleetL1Reported(t *testing.T) {
	c := startCoord(t, nil)
	for _, id := range []string{"mp-l1", "mp-l2"} {
		c.must("POST", "/instances", map[string]any{"instance_id": id, "ip": "127.0.0.1", "http_port": 8080}, 200)
	}
	reported := func() map[string]bool {
		t.Helper()
		out := map[string]bool{}
		for _, in := range c.console().Instances {
			out[in.InstanceID] = in.L1Reported
		}
		return out
	}
	if got := reported(); len(got) != 2 || got["mp-l1"] || got["mp-l2"] {
		t.Fatalf("before any fact: %v", got)
	}
	wantReply(t, c.postEvents(
		cacheBatch("mp-l1", 7, 1, "store", "l1", "dram", "t", "a1", 4096, "a2", 2048),
		cacheBatch("mp-l2", 7, 1, "store", "l2", "fs", "t", "b1", 700),
	), 2, 0, 0)
	c.wantL1("mp-l1", 6144, 2)
	c.wantL1("mp-l2", 0, 0)
	if got := reported(); !got["mp-l1"] || got["mp-l2"] {
		t.Fatalf("after one L1 and one L2 batch: %v", got)
	}
	wantReply(t, c.postEvents(cacheBatch("mp-l1", 7, 2, "delete", "l1", "dram", "t", "a1", 0, "a2", 0)), 1, 0, 0)
	c.wantL1("mp-l1", 0, 0)
	if got := reported(); !got["mp-l1"] {
		t.Fatalf("after deleting every L1 key: %v", got)
	}
	wantReply(t, c.postEvents(cacheBatch("mp-l1", 8, 1, "store", "l2", "fs", "t", "c1", 100)), 1, 0, 0)
	if got := reported(); got["mp-l1"] {
		t.Fatalf("after a new incarnation with no L1 fact: %v", got)
	}
}
