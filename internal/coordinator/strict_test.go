package coordinator_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestStrictNumberTypes: a JSON boolean where a number is expected is a
// 422 naming the field (never read as 1 or 0), and -0.0 is echoed and
// stored as 0.0.
func TestStrictNumberTypes(t *testing.T) {
	c := startCoord(t, nil)
	for _, tc := range []struct {
		method, path, body, loc string
	}{
		{"PUT", "/quota/a", `{"limit_gb": true}`, `["body","limit_gb"]`},
		{"PUT", "/quota/a", `{"limit_gb": false}`, `["body","limit_gb"]`},
		{"PUT", "/quota/config", `{"default_limit_gb": true}`, `["body","default_limit_gb"]`},
		{"POST", "/instances", `{"ip": "127.0.0.1", "http_port": true}`, `["body","http_port"]`},
		{"POST", "/quota/events", `{"instance_id": "i", "seq": true, "events": []}`, `["body","seq"]`},
		{"POST", "/quota/events", `{"instance_id": "i", "seq": 1, "events": [{"type": "store", "bytes": true, "key": {"chunk_hash_hex": "0a", "model_name": "m", "kv_rank": 0}}]}`, `["body","events",0,"bytes"]`},
		{"POST", "/quota/events", `{"instance_id": "i", "seq": 1, "events": [{"type": "store", "bytes": 1, "key": {"chunk_hash_hex": "0a", "model_name": "m", "kv_rank": true}}]}`, `["body","events",0,"key","kv_rank"]`},
		{"POST", "/cache/pins", `{"model_name": "m", "world_size": true, "token_ids": [1, 2, 3, 4]}`, `["body","world_size"]`},
		{"POST", "/cache/pins", `{"model_name": "m", "world_size": 1, "token_ids": [1, true, 3, 4]}`, `["body","token_ids",1]`},
	} {
		code, raw := c.do(tc.method, tc.path, tc.body)
		var body struct {
			Detail []struct {
				Loc json.RawMessage `json:"loc"`
			} `json:"detail"`
		}
		if code != 422 || json.Unmarshal(raw, &body) != nil || len(body.Detail) == 0 || string(body.Detail[0].Loc) != tc.loc {
			t.Errorf("%s %s %s: %d %s, want 422 at %s", tc.method, tc.path, tc.body, code, raw, tc.loc)
		}
	}
	if g := c.must("GET", "/quota/a", nil, 200); g["quota_exists"] != false {
		t.Fatalf("a boolean limit was applied: %v", g)
	}
	if _, raw := c.do("GET", "/metrics", nil); !strings.Contains(string(raw), "lmcache_coordinator_event_batches_total 0\n") {
		t.Fatal("an event batch with a boolean was applied")
	}
	if _, raw := c.do("PUT", "/quota/a", `{"limit_gb": -0.0}`); string(raw) != `{"cache_salt":"a","limit_gb":0.0,"status":"ok"}` {
		t.Fatalf("put -0.0 = %s", raw)
	}
	if _, raw := c.do("GET", "/quota/a", nil); string(raw) != `{"cache_salt":"a","quota_limit_gb":0.0,"quota_exists":true,"usage_gb":0.0}` {
		t.Fatalf("get after -0.0 = %s", raw)
	}
	if _, raw := c.do("PUT", "/quota/config", `{"default_limit_gb": -0.0}`); string(raw) != `{"default_limit_gb":0.0}` {
		t.Fatalf("put default -0.0 = %s", raw)
	}
	if _, raw := c.do("GET", "/quota/config", nil); string(raw) != `{"default_limit_gb":0.0}` {
		t.Fatalf("get default after -0.0 = %s", raw)
	}
}
