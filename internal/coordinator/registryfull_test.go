package coordinator_test

import (
	"encoding/json"
	"testing"
)

// TestRegisterRefusedWhenRegistryFull: past the registry's bound a new
// instance gets 503 with a detail and is not listed; a known one still
// re-registers. Before, every registration was taken (200).
func TestRegisterRefusedWhenRegistryFull(t *testing.T) {
	c := startCoord(t, nil)
	c.srv.SetRegistryLimits(2, 1<<20)
	for _, id := range []string{"mp-1", "mp-2"} {
		c.must("POST", "/instances", map[string]any{"instance_id": id, "ip": "127.0.0.1", "http_port": 8080}, 200)
	}
	code, raw := c.do("POST", "/instances", map[string]any{"instance_id": "mp-3", "ip": "127.0.0.1", "http_port": 8080})
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	if code != 503 || body["detail"] != "registry full: 2 instances registered; retry once stale ones are swept" {
		t.Fatalf("third registration = %d %s, want 503 with the detail", code, raw)
	}
	if l := ids(t, c); len(l) != 2 || l[0] != "mp-1" || l[1] != "mp-2" {
		t.Fatalf("instances %v, want [mp-1 mp-2]", l)
	}
	if r := c.must("POST", "/instances", map[string]any{"instance_id": "mp-1", "ip": "127.0.0.1", "http_port": 8081}, 200); r["re_registered"] != true {
		t.Fatalf("re-registration of mp-1 = %v", r)
	}
}
