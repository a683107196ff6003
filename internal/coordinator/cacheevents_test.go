package coordinator_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// cacheBatch is one CacheEventBatch shaped as newer upstream's
// HttpCacheEventSink posts it (dataclass fields in declaration order, every
// field present; LMCache/LMCache lmcache/v1/mp_coordinator/api.py at
// 08340ea4): one entry per (hash, size).
func cacheBatch(instance string, incarnation, seq int, typ, tier, backend, salt string, entries ...any) map[string]any {
	list := []any{}
	for i := 0; i+1 < len(entries); i += 2 {
		list = append(list, map[string]any{
			"key": ekey(entries[i].(string), salt), "size_bytes": entries[i+1],
			"token_ids": []any{}, "token_offset": -1,
		})
	}
	return map[string]any{
		"instance_id": instance, "incarnation": incarnation, "seq": seq,
		"event_type": typ, "tier": tier, "backend": backend, "entries": list,
		"shared": false, "ts": 1767225600.25, "capacity_bytes": 0, "capacity_revision": 0,
	}
}

func (c *coord) postEvents(batches ...map[string]any) map[string]any {
	c.t.Helper()
	return c.must("POST", "/events", map[string]any{"batches": batches}, 200)
}

// instanceRow is GET /instances' row for id.
func (c *coord) instanceRow(id string) map[string]any {
	c.t.Helper()
	for _, e := range c.must("GET", "/instances", nil, 200)["instances"].([]any) {
		if row := e.(map[string]any); row["instance_id"] == id {
			return row
		}
	}
	c.t.Fatalf("instance %s not listed", id)
	return nil
}

// wantL1 checks GET /instances' L1 view of id.
func (c *coord) wantL1(id string, bytes, keys float64) {
	c.t.Helper()
	row := c.instanceRow(id)
	if row["l1_used_bytes"] != bytes || row["l1_keys"] != keys {
		c.t.Fatalf("%s l1 = %v bytes / %v keys, want %v / %v", id, row["l1_used_bytes"], row["l1_keys"], bytes, keys)
	}
}

func wantReply(t *testing.T, got map[string]any, applied, dups, stale float64) {
	t.Helper()
	if len(got) != 3 || got["applied"] != applied || got["duplicates"] != dups || got["stale"] != stale {
		t.Fatalf("reply %v, want applied %v duplicates %v stale %v", got, applied, dups, stale)
	}
}

func metric(t *testing.T, c *coord, line string) {
	t.Helper()
	if _, raw := c.do("GET", "/metrics", nil); !strings.Contains(string(raw), line+"\n") {
		t.Fatalf("metrics lack %q:\n%s", line, raw)
	}
}

// TestCacheEventsReplayNotAppliedTwice: the same batch posted twice is
// applied once; the second reply counts a duplicate and usage is unchanged
// (a replayed delete-then-store would otherwise resurrect a deleted key).
func TestCacheEventsReplayNotAppliedTwice(t *testing.T) {
	c := startCoord(t, nil)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 8080}, 200)
	store := cacheBatch("mp-a", 1767225600, 1, "store", "l2", "s3", "t", "aa", 1000, "bb", 500)
	wantReply(t, c.postEvents(store), 1, 0, 0)
	if u := c.usageBytes("t"); u != 1500 {
		t.Fatalf("usage after store = %d", u)
	}
	del := cacheBatch("mp-a", 1767225600, 2, "delete", "l2", "s3", "t", "aa", 0)
	wantReply(t, c.postEvents(del), 1, 0, 0)
	// Redelivery of both (an at-least-once transport): nothing applies.
	wantReply(t, c.postEvents(store, del), 0, 2, 0)
	if u := c.usageBytes("t"); u != 500 {
		t.Fatalf("usage after replay = %d, want 500 (aa deleted, not resurrected)", u)
	}
	st := c.instanceRow("mp-a")["event_stream"].(map[string]any)
	if st["incarnation"] != 1767225600.0 || st["last_seq"] != 2.0 || st["applied"] != 2.0 || st["duplicates"] != 2.0 || st["gap_detected"] != false {
		t.Fatalf("event_stream = %v", st)
	}
	metric(t, c, `lmcache_coordinator_event_gate_batches_total{door="events",result="duplicate"} 2`)
	metric(t, c, `lmcache_coordinator_event_gate_batches_total{door="events",result="admitted"} 2`)
}

// TestCacheEventsIncarnationFence: a higher incarnation fences the old
// one's L1 facts (its memory restarted empty) and keeps its L2 facts (the
// bytes persist); a batch from the old incarnation after that is stale.
func TestCacheEventsIncarnationFence(t *testing.T) {
	c := startCoord(t, nil)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-b", "ip": "127.0.0.1", "http_port": 8081}, 200)
	wantReply(t, c.postEvents(
		cacheBatch("mp-b", 100, 1, "store", "l1", "dram", "t", "a1", 4096, "a2", 4096),
		cacheBatch("mp-b", 100, 2, "store", "l2", "fs", "t", "b1", 700),
	), 2, 0, 0)
	c.wantL1("mp-b", 8192, 2)
	if u := c.usageBytes("t"); u != 700 {
		t.Fatalf("l2 usage = %d, want 700 (l1 facts are not L2 usage)", u)
	}
	// Restart: incarnation 101 starts again at seq 1.
	wantReply(t, c.postEvents(cacheBatch("mp-b", 101, 1, "store", "l1", "dram", "t", "c1", 100)), 1, 0, 0)
	c.wantL1("mp-b", 100, 1) // only the new incarnation's fact
	if u := c.usageBytes("t"); u != 700 {
		t.Fatalf("l2 usage after fence = %d, want 700 kept", u)
	}
	// A late batch of the old incarnation is stale and changes nothing.
	wantReply(t, c.postEvents(cacheBatch("mp-b", 100, 3, "store", "l2", "fs", "t", "b2", 50)), 0, 0, 1)
	if u := c.usageBytes("t"); u != 700 {
		t.Fatalf("stale batch applied: %d", u)
	}
	st := c.instanceRow("mp-b")["event_stream"].(map[string]any)
	if st["incarnation"] != 101.0 || st["last_seq"] != 1.0 || st["fences"] != 1.0 || st["stale"] != 1.0 {
		t.Fatalf("event_stream = %v", st)
	}
	metric(t, c, "lmcache_coordinator_event_gate_fences_total 1")
	metric(t, c, "lmcache_coordinator_l1_facts_fenced_total 2")
	metric(t, c, `lmcache_coordinator_event_gate_batches_total{door="events",result="stale"} 1`)
}

// TestCacheEventsGapAdmitted: a seq jump (the emitter dropped batches while
// the coordinator was away) is counted and flagged, and the batch applies.
func TestCacheEventsGapAdmitted(t *testing.T) {
	c := startCoord(t, nil)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-c", "ip": "127.0.0.1", "http_port": 8082}, 200)
	wantReply(t, c.postEvents(cacheBatch("mp-c", 5, 1, "store", "l2", "s3", "g", "aa", 10)), 1, 0, 0)
	wantReply(t, c.postEvents(cacheBatch("mp-c", 5, 4, "store", "l2", "s3", "g", "bb", 20)), 1, 0, 0)
	if u := c.usageBytes("g"); u != 30 {
		t.Fatalf("usage = %d, want 30 (gap batch applied)", u)
	}
	st := c.instanceRow("mp-c")["event_stream"].(map[string]any)
	if st["gap_detected"] != true || st["gaps"] != 1.0 || st["last_seq"] != 4.0 {
		t.Fatalf("event_stream = %v", st)
	}
	// seq 2 and 3 arriving late are behind the cursor now: duplicates.
	wantReply(t, c.postEvents(cacheBatch("mp-c", 5, 2, "store", "l2", "s3", "g", "cc", 40)), 0, 1, 0)
	metric(t, c, `lmcache_coordinator_event_gate_gaps_total{door="events"} 1`)
}

// TestCacheEventsBadEntryRejectsAll: one bad entry anywhere rejects the
// whole request with 422 naming it, and nothing (not even the earlier
// valid batches) is applied or advances a cursor.
func TestCacheEventsBadEntryRejectsAll(t *testing.T) {
	c := startCoord(t, nil)
	good := cacheBatch("mp-d", 1, 1, "store", "l2", "s3", "v", "aa", 100)
	cases := map[string]struct {
		bad map[string]any
		loc string
		msg string
	}{
		"bad hex":          {cacheBatch("mp-d", 1, 2, "store", "l2", "s3", "v", "zz", 5), `["body","batches",1,"entries",0,"key"]`, "hex"},
		"negative size":    {cacheBatch("mp-d", 1, 2, "store", "l2", "s3", "v", "ab", -1), `["body","batches",1,"entries",0]`, "size_bytes must be >= 0"},
		"seq 0":            {cacheBatch("mp-d", 1, 0, "store", "l2", "s3", "v", "ab", 5), `["body","batches",1]`, "seq must be >= 1"},
		"tier all":         {cacheBatch("mp-d", 1, 2, "store", "all", "s3", "v", "ab", 5), `["body","batches",1]`, "concrete tier"},
		"empty backend":    {cacheBatch("mp-d", 1, 2, "delete", "l2", "", "v", "ab", 0), `["body","batches",1]`, "backend must be non-empty for delete"},
		"unknown type":     {cacheBatch("mp-d", 1, 2, "evict", "l2", "s3", "v", "ab", 0), `["body","batches",1,"event_type"]`, "'store', 'delete', 'access' or 'config'"},
		"negative incarn.": {cacheBatch("mp-d", -1, 2, "store", "l2", "s3", "v", "ab", 5), `["body","batches",1]`, "incarnation must be >= 0"},
		"config entries":   {cacheBatch("mp-d", 1, 2, "config", "l2", "s3", "v", "ab", 5), `["body","batches",1]`, "carry no entries"},
		"bad token offset": {func() map[string]any {
			b := cacheBatch("mp-d", 1, 2, "store", "l2", "s3", "v", "ab", 5)
			b["entries"].([]any)[0].(map[string]any)["token_offset"] = -2
			return b
		}(), `["body","batches",1,"entries",0]`, "token_offset must be >= 0"},
	}
	for name, tc := range cases {
		code, raw := c.do("POST", "/events", map[string]any{"batches": []any{good, tc.bad}})
		if code != 422 {
			t.Fatalf("%s: %d %s", name, code, raw)
		}
		var body struct {
			Detail []struct {
				Loc json.RawMessage `json:"loc"`
				Msg string          `json:"msg"`
			} `json:"detail"`
		}
		if err := json.Unmarshal(raw, &body); err != nil || len(body.Detail) == 0 {
			t.Fatalf("%s: detail %s (%v)", name, raw, err)
		}
		if string(body.Detail[0].Loc) != tc.loc || !strings.Contains(body.Detail[0].Msg, tc.msg) {
			t.Fatalf("%s: loc %s msg %q, want %s and %q", name, body.Detail[0].Loc, body.Detail[0].Msg, tc.loc, tc.msg)
		}
	}
	if u := c.usageBytes("v"); u != 0 {
		t.Fatalf("rejected requests applied %d bytes", u)
	}
	// The cursor never moved: the good batch still applies as seq 1.
	wantReply(t, c.postEvents(good), 1, 0, 0)
	if u := c.usageBytes("v"); u != 100 {
		t.Fatalf("usage = %d", u)
	}
}

// TestCacheEventsShapes: an empty body object is an empty batch list; access
// batches (empty backend) refresh recency; config batches are admitted
// without effect; l1 deletes lower the L1 view.
func TestCacheEventsShapes(t *testing.T) {
	c := startCoord(t, nil)
	wantReply(t, c.must("POST", "/events", map[string]any{}, 200), 0, 0, 0)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-e", "ip": "127.0.0.1", "http_port": 8083}, 200)
	cfg := cacheBatch("mp-e", 2, 3, "config", "l1", "dram", "")
	cfg["capacity_bytes"], cfg["capacity_revision"] = 1<<30, 1
	wantReply(t, c.postEvents(
		cacheBatch("mp-e", 2, 1, "store", "l1", "dram", "s", "aa", 64, "bb", 32),
		cacheBatch("mp-e", 2, 2, "access", "l2", "", "s", "aa", 0),
		cfg,
		cacheBatch("mp-e", 2, 4, "delete", "l1", "dram", "s", "aa", 0),
	), 4, 0, 0)
	c.wantL1("mp-e", 32, 1)
	if u := c.usageBytes("s"); u != 0 {
		t.Fatalf("l2 usage from l1 batches / access: %d", u)
	}
	if code, raw := c.do("POST", "/events", map[string]any{"batches": "x"}); code != 422 || !strings.Contains(string(raw), `"list_type"`) {
		t.Fatalf("batches not a list: %d %s", code, raw)
	}
}

// TestCacheEventsAuth: with --auth-token, /events needs the token and an
// unauthenticated batch changes nothing (not even the gate's cursor).
func TestCacheEventsAuth(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.AuthToken = coordToken })
	b := cacheBatch("mp-f", 1, 1, "store", "l2", "s3", "k", "aa", 9)
	body, _ := json.Marshal(map[string]any{"batches": []any{b}})
	if code, _, raw := c.doAuth("POST", "/events", string(body), ""); code != 401 {
		t.Fatalf("no token: %d %s", code, raw)
	}
	if u := c.usageBytes("k"); u != 0 {
		t.Fatalf("unauthenticated batch applied: %d", u)
	}
	code, _, raw := c.doAuth("POST", "/events", string(body), "Bearer "+coordToken)
	if code != 200 || string(raw) != `{"applied":1,"duplicates":0,"stale":0}` {
		t.Fatalf("with token: %d %s", code, raw)
	}
}

// TestQuotaEventsReplayCountedNotDropped: the spec-era door keeps applying
// replays (research 5.6: upstream re-applies them), and counts them.
func TestQuotaEventsReplayCountedNotDropped(t *testing.T) {
	c := startCoord(t, nil)
	c.must("POST", "/instances", map[string]any{"instance_id": "q1", "ip": "127.0.0.1", "http_port": 8084}, 200)
	post := func(seq int, evs ...map[string]any) {
		if g := c.must("POST", "/quota/events", map[string]any{"instance_id": "q1", "seq": seq, "events": evs, "tier": "l2"}, 200); g["recorded"] != float64(len(evs)) {
			t.Fatalf("recorded = %v", g)
		}
	}
	post(1, ev("store", "aa", "q", 10))
	post(2, ev("delete", "aa", "q", 0))
	post(1, ev("store", "aa", "q", 10)) // replay of seq 1: applied again
	if u := c.usageBytes("q"); u != 10 {
		t.Fatalf("usage = %d, want 10 (the replayed store re-applied, as upstream)", u)
	}
	st := c.instanceRow("q1")["quota_event_stream"].(map[string]any)
	if st["duplicates"] != 1.0 || st["applied"] != 3.0 || st["last_seq"] != 1.0 {
		t.Fatalf("quota_event_stream = %v", st)
	}
	if c.instanceRow("q1")["event_stream"] != nil {
		t.Fatal("quota door created an /events cursor")
	}
	metric(t, c, `lmcache_coordinator_event_gate_batches_total{door="quota_events",result="replay_applied"} 1`)
	metric(t, c, `lmcache_coordinator_event_gate_batches_total{door="quota_events",result="admitted"} 2`)
}
