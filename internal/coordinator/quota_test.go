package coordinator_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

const gib = 1 << 30

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// TestQuotaWrites is research 10.5 "Quota writes".
func TestQuotaWrites(t *testing.T) {
	c := startCoord(t, nil)
	got := c.must("PUT", "/quota/user-a", map[string]any{"limit_gb": 2.5}, 200)
	if got["cache_salt"] != "user-a" || got["limit_gb"] != 2.5 || got["status"] != "ok" {
		t.Fatalf("put = %v", got)
	}
	c.must("PUT", "/quota/user-b", map[string]any{"limit_gb": 1.0}, 200)
	c.must("PUT", "/quota/user-b", map[string]any{"limit_gb": 5.0, "tier": "l2"}, 200)
	if g := c.must("GET", "/quota/user-b", nil, 200); !near(g["quota_limit_gb"].(float64), 5) || g["quota_exists"] != true {
		t.Fatalf("update = %v", g)
	}
	if g := c.must("DELETE", "/quota/user-b", nil, 200); g["status"] != "removed" || g["limit_gb"] != 0.0 || g["cache_salt"] != "user-b" {
		t.Fatalf("delete = %v", g)
	}
	if g := c.must("GET", "/quota/user-b", nil, 200); g["quota_exists"] != false {
		t.Fatalf("after delete = %v", g)
	}
	if g := c.must("DELETE", "/quota/nobody", nil, 200); g["status"] != "not_found" {
		t.Fatalf("delete unknown = %v", g)
	}
	c.must("PUT", "/quota/user-c", map[string]any{"limit_gb": -1}, 422)
	c.must("PUT", "/quota/user-c", nil, 422)
	c.must("PUT", "/quota/user-c", map[string]any{"tier": "l2"}, 422)
	c.must("PUT", "/quota/user-c", map[string]any{"limit_gb": "abc"}, 422)
	// Non-finite limits: upstream crashes (500) on Infinity; we answer 400.
	for _, v := range []string{"Infinity", "NaN", "inf"} {
		if g := c.must("PUT", "/quota/user-c", map[string]any{"limit_gb": v}, 400); !strings.Contains(g["detail"].(string), "invalid quota limit") {
			t.Fatalf("non-finite %s = %v", v, g)
		}
	}
	c.must("PUT", "/quota/user-c", map[string]any{"limit_gb": 0}, 200)
	if g := c.must("GET", "/quota/user-c", nil, 200); g["quota_exists"] != true || g["quota_limit_gb"] != 0.0 {
		t.Fatalf("zero quota = %v", g)
	}
	// _default is the empty salt.
	if g := c.must("PUT", "/quota/_default", map[string]any{"limit_gb": 1.5}, 200); g["cache_salt"] != "" {
		t.Fatalf("_default put = %v", g)
	}
	if g := c.must("GET", "/quota/_default", nil, 200); g["cache_salt"] != "" || !near(g["quota_limit_gb"].(float64), 1.5) {
		t.Fatalf("_default get = %v", g)
	}
}

// TestQuotaConfig is research 10.5 "Quota config" and the quirks of 3.2.
func TestQuotaConfig(t *testing.T) {
	c := startCoord(t, nil)
	if _, raw := c.do("GET", "/quota/config", nil); string(raw) != `{"default_limit_gb":null}` {
		t.Fatalf("boot = %s", raw)
	}
	if code, raw := c.do("PUT", "/quota/config", map[string]any{"default_limit_gb": 0}); code != 200 || string(raw) != `{"default_limit_gb":0.0}` {
		t.Fatalf("put 0 = %d %s", code, raw)
	}
	if _, raw := c.do("GET", "/quota/config", nil); string(raw) != `{"default_limit_gb":0.0}` {
		t.Fatalf("get after 0 = %s", raw)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 2.5}, 200)
	if g := c.must("GET", "/quota/config", nil, 200); !near(g["default_limit_gb"].(float64), 2.5) {
		t.Fatalf("2.5 = %v", g)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 0.1}, 200)
	if g := c.must("GET", "/quota/config", nil, 200); !near(g["default_limit_gb"].(float64), 0.1) {
		t.Fatalf("0.1 = %v", g)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": nil}, 200)
	if _, raw := c.do("GET", "/quota/config", nil); string(raw) != `{"default_limit_gb":null}` {
		t.Fatalf("after null = %s", raw)
	}
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": -1}, 422)
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 3}, 200)
	// Upstream quirk kept: {} resets the default to null.
	if g := c.must("PUT", "/quota/config", map[string]any{}, 200); g["default_limit_gb"] != nil {
		t.Fatalf("{} = %v", g)
	}
	// PUT /quota/config never creates a salt named config.
	if g := c.must("GET", "/quota", nil, 200); len(g["by_cache_salt"].([]any)) != 0 {
		t.Fatalf("config leaked as a salt: %v", g)
	}
	// Route quirks: DELETE /quota/config and GET /quota/events address salts.
	c.must("PUT", "/quota/events", map[string]any{"limit_gb": 1}, 200)
	if g := c.must("GET", "/quota/events", nil, 200); g["cache_salt"] != "events" || g["quota_exists"] != true {
		t.Fatalf("salt events = %v", g)
	}
	if g := c.must("DELETE", "/quota/config", nil, 200); g["cache_salt"] != "config" || g["status"] != "not_found" {
		t.Fatalf("delete config = %v", g)
	}
}

func TestTierParameter(t *testing.T) {
	c := startCoord(t, nil)
	for _, tier := range []string{"l1", "all"} {
		g := c.must("PUT", "/quota/a", map[string]any{"limit_gb": 1, "tier": tier}, 400)
		if g["detail"] != fmt.Sprintf("tier '%s' not supported; only 'l2'", tier) {
			t.Fatalf("detail %v", g)
		}
		c.must("GET", "/quota/a?tier="+tier, nil, 400)
		c.must("GET", "/quota?tier="+tier, nil, 400)
		c.must("DELETE", "/quota/a?tier="+tier, nil, 400)
		c.must("GET", "/quota/config?tier="+tier, nil, 400)
		c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 1, "tier": tier}, 400)
		c.must("POST", "/quota/events", map[string]any{"instance_id": "i", "seq": 1, "events": []any{}, "tier": tier}, 400)
	}
	c.must("GET", "/quota/a?tier=l3", nil, 422)
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 1, "tier": "l3"}, 422)
	c.must("GET", "/quota?tier=l2", nil, 200)
	if g := c.must("GET", "/quota/a", nil, 200); g["quota_exists"] != false {
		t.Fatalf("rejected tier wrote a quota: %v", g)
	}
}

// TestEventIngest is research 10.5 "Event ingest".
func TestEventIngest(t *testing.T) {
	c := startCoord(t, nil)
	got := c.must("POST", "/quota/events", map[string]any{"instance_id": "s1", "seq": 1, "events": []any{
		ev("store", "aa", "user-a", 1000), ev("store", "bb", "user-a", 500), ev("store", "cc", "user-b", 2000)}}, 200)
	if got["recorded"] != 3.0 {
		t.Fatalf("recorded = %v", got)
	}
	if g := c.must("GET", "/quota/user-a", nil, 200); math.Abs(g["usage_gb"].(float64)-1500.0/gib) > 1e-12 {
		t.Fatalf("usage a = %v", g)
	}
	if g := c.must("GET", "/quota/user-b", nil, 200); math.Abs(g["usage_gb"].(float64)-2000.0/gib) > 1e-12 {
		t.Fatalf("usage b = %v", g)
	}
	if g := c.must("POST", "/quota/events", map[string]any{"instance_id": "s1", "seq": 2, "events": []any{ev("lookup", "aa", "user-a", 0)}}, 200); g["recorded"] != 1.0 {
		t.Fatalf("lookup = %v", g)
	}
	if g := c.must("POST", "/quota/events", map[string]any{"instance_id": "s1", "seq": 3, "events": []any{}}, 200); g["recorded"] != 0.0 {
		t.Fatalf("empty = %v", g)
	}
	// A delete subtracts the recorded size, not the wire bytes.
	c.events(ev("delete", "aa", "user-a", 0))
	if u := c.usageBytes("user-a"); u != 500 {
		t.Fatalf("after delete = %d", u)
	}
	// Duplicate store replaces the size.
	c.events(ev("store", "bb", "user-a", 700))
	if u := c.usageBytes("user-a"); u != 700 {
		t.Fatalf("re-store = %d", u)
	}
	if g := c.must("POST", "/quota/events", map[string]any{"instance_id": "s1", "seq": 4, "events": []any{ev("delete", "ff", "nobody", 0)}}, 200); g["recorded"] != 1.0 {
		t.Fatalf("unknown delete = %v", g)
	}
	if u := c.usageBytes("nobody"); u != 0 {
		t.Fatalf("unknown delete changed usage %d", u)
	}
	// _default maps to the empty salt.
	c.events(ev("store", "dd", "", 300))
	if g := c.must("GET", "/quota/_default", nil, 200); g["cache_salt"] != "" || math.Abs(g["usage_gb"].(float64)-300.0/gib) > 1e-12 {
		t.Fatalf("_default = %v", g)
	}
	// Hex case does not matter: AA and aa are the same key.
	c.events(ev("store", "EE", "z", 10), ev("store", "ee", "z", 20))
	if u := c.usageBytes("z"); u != 20 {
		t.Fatalf("hex case = %d", u)
	}
	// seq is only validated; a replay re-applies idempotently. Gaps and
	// regressions are counted, never dropped.
	c.events(ev("store", "ee", "z", 20))
	if u := c.usageBytes("z"); u != 20 {
		t.Fatalf("replay = %d", u)
	}
	c.must("POST", "/quota/events", map[string]any{"instance_id": "s2", "seq": 1, "events": []any{}}, 200)
	c.must("POST", "/quota/events", map[string]any{"instance_id": "s2", "seq": 5, "events": []any{ev("store", "ab", "z2", 1)}}, 200)
	if u := c.usageBytes("z2"); u != 1 {
		t.Fatalf("gap batch not applied: %d", u)
	}
	_, raw := c.do("GET", "/metrics", nil)
	if !strings.Contains(string(raw), "lmcache_coordinator_event_seq_gaps_total 1\n") || !strings.Contains(string(raw), "lmcache_coordinator_event_seq_regressions_total 4\n") {
		t.Fatalf("seq metrics:\n%s", raw)
	}
}

func TestEventValidation422(t *testing.T) {
	c := startCoord(t, nil)
	bad := map[string]map[string]any{
		"type purge":      {"instance_id": "i", "seq": 1, "events": []any{ev("purge", "aa", "a", 1)}},
		"bytes -1":        {"instance_id": "i", "seq": 1, "events": []any{ev("store", "aa", "a", -1)}},
		"bytes missing":   {"instance_id": "i", "seq": 1, "events": []any{map[string]any{"type": "store", "key": ekey("aa", "a")}}},
		"seq 0":           {"instance_id": "i", "seq": 0, "events": []any{}},
		"seq missing":     {"instance_id": "i", "events": []any{}},
		"instance absent": {"seq": 1, "events": []any{}},
		"events missing":  {"instance_id": "i", "seq": 1},
		"kv_rank missing": {"instance_id": "i", "seq": 1, "events": []any{map[string]any{"type": "store", "bytes": 1, "key": map[string]any{"chunk_hash_hex": "aa", "model_name": "m"}}}},
	}
	for name, body := range bad {
		t.Run(name, func(t *testing.T) {
			c.must("POST", "/quota/events", body, 422)
		})
	}
	// Lax ints ("5", 5.0) are accepted as Pydantic does.
	c.must("POST", "/quota/events", map[string]any{"instance_id": "i", "seq": "2", "events": []any{
		map[string]any{"type": "store", "key": ekey("aa", "lax"), "bytes": "5"},
		map[string]any{"type": "store", "key": ekey("bb", "lax"), "bytes": 6.0}}}, 200)
	if u := c.usageBytes("lax"); u != 11 {
		t.Fatalf("lax usage = %d", u)
	}
}

// TestEventBatchValidatedBeforeApply: one bad key rejects the whole batch
// with a 422 naming its index, and nothing is applied (upstream applies the
// events before it and answers 500).
func TestEventBatchValidatedBeforeApply(t *testing.T) {
	c := startCoord(t, nil)
	badKeys := map[string]map[string]any{
		"bad hex":        {"chunk_hash_hex": "zz", "model_name": "m", "kv_rank": 0, "cache_salt": "a"},
		"odd hex":        {"chunk_hash_hex": "abc", "model_name": "m", "kv_rank": 0, "cache_salt": "a"},
		"@ in model":     {"chunk_hash_hex": "aa", "model_name": "m@x", "kv_rank": 0, "cache_salt": "a"},
		"bad salt":       {"chunk_hash_hex": "aa", "model_name": "m", "kv_rank": 0, "cache_salt": "a/b"},
		"negative group": {"chunk_hash_hex": "aa", "model_name": "m", "kv_rank": 0, "object_group_id": -1, "cache_salt": "a"},
	}
	for name, k := range badKeys {
		t.Run(name, func(t *testing.T) {
			g := c.must("POST", "/quota/events", map[string]any{"instance_id": "i", "seq": 1, "events": []any{
				ev("store", "01", "a", 100), map[string]any{"type": "store", "key": k, "bytes": 5}, ev("store", "02", "a", 100)}}, 422)
			d := g["detail"].([]any)[0].(map[string]any)
			loc := d["loc"].([]any)
			if loc[1] != "events" || loc[2] != 1.0 || !strings.Contains(d["msg"].(string), "event 1") {
				t.Fatalf("detail %v", d)
			}
			if u := c.usageBytes("a"); u != 0 {
				t.Fatalf("partial batch applied: usage %d", u)
			}
		})
	}
	// Whitespace between hex pairs is accepted (bytes.fromhex).
	c.events(map[string]any{"type": "store", "key": ekey("aa bb", "ws"), "bytes": 3})
	c.events(ev("delete", "aabb", "ws", 0))
	if u := c.usageBytes("ws"); u != 0 {
		t.Fatalf("whitespace hex not the same key: %d", u)
	}
}

// TestQuotaStatusReads is research 10.5 "Status reads".
func TestQuotaStatusReads(t *testing.T) {
	c := startCoord(t, nil)
	if _, raw := c.do("GET", "/quota", nil); string(raw) != `{"total_gb":0.0,"by_cache_salt":[]}` {
		t.Fatalf("empty = %s", raw)
	}
	if _, raw := c.do("GET", "/quota/unknown", nil); string(raw) != `{"cache_salt":"unknown","quota_limit_gb":0.0,"quota_exists":false,"usage_gb":0.0}` {
		t.Fatalf("unknown = %s", raw)
	}
	c.events(ev("store", "01", "b", 200), ev("store", "02", "a", 100))
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 1}, 200)
	c.must("PUT", "/quota/q-only", map[string]any{"limit_gb": 2}, 200)
	// The default limit is not reflected in quota_limit_gb.
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 7}, 200)
	g := c.must("GET", "/quota", nil, 200)
	if math.Abs(g["total_gb"].(float64)-300.0/gib) > 1e-12 {
		t.Fatalf("total %v", g)
	}
	rows := g["by_cache_salt"].([]any)
	var names []string
	for _, r := range rows {
		names = append(names, r.(map[string]any)["cache_salt"].(string))
	}
	if strings.Join(names, ",") != "a,b,q-only" {
		t.Fatalf("rows %v", names)
	}
	a, b, q := rows[0].(map[string]any), rows[1].(map[string]any), rows[2].(map[string]any)
	if a["quota_exists"] != true || b["quota_exists"] != false || b["quota_limit_gb"] != 0.0 || q["usage_gb"] != 0.0 || !near(q["quota_limit_gb"].(float64), 2) {
		t.Fatalf("rows %v", rows)
	}
}

// TestQuotaConfigNonFinite: a non-finite default_limit_gb is a 400 whose
// detail names the field, and the stored default is left as it was. JSON
// has no NaN or Infinity literal; upstream (Pydantic, lax float) reads the
// strings "NaN", "Infinity", "inf" as such, and json.loads reads a literal
// past float64's range (1e999) as inf, so all of them are non-finite here.
// A negative finite value stays the 422 field error.
func TestQuotaConfigNonFinite(t *testing.T) {
	c := startCoord(t, nil)
	c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 3}, 200)
	const want = `{"default_limit_gb":3.0}`
	for _, body := range []string{
		`{"default_limit_gb":1e999}`, `{"default_limit_gb":-1e999}`,
		`{"default_limit_gb":"Infinity"}`, `{"default_limit_gb":"-inf"}`, `{"default_limit_gb":"NaN"}`, `{"default_limit_gb":"1e999"}`,
	} {
		code, raw := c.do("PUT", "/quota/config", body)
		if code != 400 || string(raw) != `{"detail":"invalid quota limit: default_limit_gb must be finite"}` {
			t.Errorf("PUT %s = %d %s, want 400 with the finite detail", body, code, raw)
		}
		if _, raw := c.do("GET", "/quota/config", nil); string(raw) != want {
			t.Fatalf("after PUT %s: GET /quota/config = %s, want %s unchanged", body, raw, want)
		}
	}
	code, raw := c.do("PUT", "/quota/config", `{"default_limit_gb":-1}`)
	if code != 422 || !strings.Contains(string(raw), `"type":"greater_than_equal","loc":["body","default_limit_gb"]`) {
		t.Fatalf("negative = %d %s, want the 422 field error", code, raw)
	}
	if _, raw := c.do("GET", "/quota/config", nil); string(raw) != want {
		t.Fatalf("after the negative PUT: %s, want %s", raw, want)
	}
	// The same reading for a tenant's limit_gb.
	if code, raw := c.do("PUT", "/quota/user-c", `{"limit_gb":1e999}`); code != 400 || string(raw) != `{"detail":"invalid quota limit: limit_gb must be finite"}` {
		t.Fatalf("PUT /quota/user-c 1e999 = %d %s", code, raw)
	}
	if g := c.must("GET", "/quota/user-c", nil, 200); g["quota_exists"] != false {
		t.Fatalf("rejected limit wrote a quota: %v", g)
	}
}
