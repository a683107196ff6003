package coordinator_test

import (
	"fmt"
	"strings"
	"testing"
)

// detail0 is the first FastAPI detail item of a 422 reply: its type and
// its loc joined with dots.
func detail0(t *testing.T, m map[string]any) (typ, loc string) {
	t.Helper()
	items, _ := m["detail"].([]any)
	if len(items) == 0 {
		t.Fatalf("no detail items: %v", m)
	}
	it := items[0].(map[string]any)
	var parts []string
	for _, p := range it["loc"].([]any) {
		parts = append(parts, fmt.Sprint(p))
	}
	return fmt.Sprint(it["type"]), strings.Join(parts, ".")
}

// TestNameLengthBounds: an instance_id over 256 bytes (registration, POST
// /quota/events, POST /events, a warm prefetch) and a model_name over 1024
// bytes (an event key, a pin) are refused with 422 and FastAPI-style
// detail, and the refused request changes nothing: no registration, no
// usage, no L1 fact. Names at the bounds are accepted.
func TestNameLengthBounds(t *testing.T) {
	c := startCoord(t, nil)
	longID, okID := strings.Repeat("i", 257), strings.Repeat("i", 256)
	longModel, okModel := strings.Repeat("m", 1025), strings.Repeat("m", 1024)
	keyOf := func(model string) map[string]any {
		return map[string]any{"chunk_hash_hex": "0a", "model_name": model, "kv_rank": 0, "cache_salt": "s"}
	}

	g := c.must("POST", "/instances", map[string]any{"instance_id": longID, "ip": "127.0.0.1", "http_port": 8080}, 422)
	if typ, loc := detail0(t, g); typ != "string_too_long" || loc != "body.instance_id" {
		t.Fatalf("registration detail %s at %s: %v", typ, loc, g)
	}
	if n := len(c.must("GET", "/instances", nil, 200)["instances"].([]any)); n != 0 {
		t.Fatalf("%d instances registered after the refusal", n)
	}
	c.must("POST", "/instances", map[string]any{"instance_id": okID, "ip": "127.0.0.1", "http_port": 8080}, 200)

	for _, tc := range []struct {
		name, instance, model, wantType, wantLoc string
	}{
		{"long instance", longID, "m", "string_too_long", "body.instance_id"},
		{"long model", "i1", longModel, "value_error", "body.events.0.key"},
	} {
		body := map[string]any{"instance_id": tc.instance, "seq": 1, "events": []any{
			map[string]any{"type": "store", "key": keyOf("m"), "bytes": 5},
			map[string]any{"type": "store", "key": keyOf(tc.model), "bytes": 7}}}
		// The last event carries the long model; the first is valid.
		if tc.model != "m" {
			body["events"].([]any)[0], body["events"].([]any)[1] = body["events"].([]any)[1], body["events"].([]any)[0]
		}
		g := c.must("POST", "/quota/events", body, 422)
		if typ, loc := detail0(t, g); typ != tc.wantType || loc != tc.wantLoc {
			t.Fatalf("%s: POST /quota/events detail %s at %s: %v", tc.name, typ, loc, g)
		}
		if u := c.usageBytes("s"); u != 0 {
			t.Fatalf("%s: usage %d after a refused batch", tc.name, u)
		}
	}
	c.must("POST", "/quota/events", map[string]any{"instance_id": okID, "seq": 1, "events": []any{
		map[string]any{"type": "store", "key": keyOf(okModel), "bytes": 7}}}, 200)
	if u := c.usageBytes("s"); u != 7 {
		t.Fatalf("usage %d after names at the bounds, want 7", u)
	}

	l1 := func(instance, model string) map[string]any {
		return map[string]any{"instance_id": instance, "incarnation": 1, "seq": 1, "event_type": "store", "tier": "l1", "backend": "l1",
			"entries": []any{map[string]any{"key": keyOf(model), "size_bytes": 3, "token_ids": []any{}, "token_offset": -1}},
			"shared":  false, "ts": 1767225600.25, "capacity_bytes": 0, "capacity_revision": 0}
	}
	for _, tc := range []struct{ name, instance, model, wantType, wantLoc string }{
		{"long instance", longID, "m", "string_too_long", "body.batches.0.instance_id"},
		{"long model", okID, longModel, "value_error", "body.batches.0.entries.0.key"},
	} {
		g := c.must("POST", "/events", map[string]any{"batches": []any{l1(tc.instance, tc.model)}}, 422)
		if typ, loc := detail0(t, g); typ != tc.wantType || loc != tc.wantLoc {
			t.Fatalf("%s: POST /events detail %s at %s: %v", tc.name, typ, loc, g)
		}
	}
	c.wantL1(okID, 0, 0)
	c.postEvents(l1(okID, okModel))
	c.wantL1(okID, 3, 1)

	pin := map[string]any{"model_name": longModel, "world_size": 1, "token_ids": []int{1, 2, 3, 4}, "cache_salt": "s"}
	g = c.must("POST", "/cache/pins", pin, 422)
	if typ, loc := detail0(t, g); typ != "string_too_long" || loc != "body.model_name" {
		t.Fatalf("pin detail %s at %s: %v", typ, loc, g)
	}
	pf := map[string]any{"instance_id": longID, "model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}}
	g = c.must("POST", "/cache/prefetches", pf, 422)
	if typ, loc := detail0(t, g); typ != "string_too_long" || loc != "body.instance_id" {
		t.Fatalf("prefetch detail %s at %s: %v", typ, loc, g)
	}
}
