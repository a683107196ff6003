package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/httproute"
)

// TestOpenAPIValidatesWithSchemas: the coordinator's /openapi.json loads
// and validates as OpenAPI 3 (kin-openapi); every public route is in it
// with a schema for each documented response (204 aside) and, for routes
// with a body, for the request; with --auth-token the guarded operations
// carry the bearer requirement.
func TestOpenAPIValidatesWithSchemas(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.AuthToken = "tok-openapi" })
	doc := c.openAPI(t)
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("/openapi.json is not valid OpenAPI 3: %v", err)
	}
	withBody := map[string]bool{"POST /instances": true, "PUT /quota/config": true, "POST /quota/events": true, "POST /events": true,
		"PUT /quota/{cache_salt}": true, "POST /cache/prefetches": true, "POST /cache/pins": true, "DELETE /cache/pins": true, "POST /debug/pprof/symbol": true}
	public := 0
	for _, rt := range c.srv.Routes() {
		if rt.Hidden {
			continue
		}
		public++
		item := doc.Paths.Value(rt.Path)
		if item == nil || item.GetOperation(rt.Method) == nil {
			t.Errorf("%s %s missing", rt.Method, rt.Path)
			continue
		}
		op := item.GetOperation(rt.Method)
		for status, resp := range op.Responses.Map() {
			if status == "204" {
				if len(resp.Value.Content) != 0 {
					t.Errorf("%s %s 204 has a body", rt.Method, rt.Path)
				}
				continue
			}
			if len(resp.Value.Content) != 1 {
				t.Errorf("%s %s %s: content %v", rt.Method, rt.Path, status, resp.Value.Content)
			}
			for ct, mt := range resp.Value.Content {
				if mt.Schema == nil || mt.Schema.Value == nil || mt.Schema.Value.Type == nil {
					t.Errorf("%s %s %s %s: untyped schema", rt.Method, rt.Path, status, ct)
				}
			}
		}
		key := rt.Method + " " + rt.Path
		if got := op.RequestBody != nil; got != withBody[key] {
			t.Errorf("%s: request body documented %v, want %v", key, got, withBody[key])
		} else if got && rt.Path != "/debug/pprof/symbol" && op.RequestBody.Value.Content.Get("application/json").Schema.Value.Properties == nil {
			t.Errorf("%s: request schema has no properties", key)
		}
		if secured := op.Security != nil && len(*op.Security) == 1; secured != rt.Auth {
			t.Errorf("%s: security %v, auth %v", key, secured, rt.Auth)
		}
	}
	if public != 29 {
		t.Errorf("%d public routes", public)
	}
	// Typed means typed: the only free-form object body is the document
	// itself, so a route added with a map[string]any body fails here.
	if got, want := httproute.FreeFormBodies(doc), []string{"GET /openapi.json 200"}; !slices.Equal(got, want) {
		t.Errorf("free-form bodies %q, want %q (type the body)", got, want)
	}
	reg := doc.Paths.Value("/instances").Post.RequestBody.Value.Content.Get("application/json").Schema.Value
	if len(reg.Required) != 2 || reg.Required[0] != "ip" || reg.Required[1] != "http_port" {
		t.Errorf("RegisterRequest required = %v", reg.Required)
	}
	def := doc.Paths.Value("/quota/config").Get.Responses.Value("200").Value.Content.Get("application/json").Schema.Value
	if d := def.Properties["default_limit_gb"]; d == nil || !d.Value.Nullable || !d.Value.Type.Is("number") {
		t.Errorf("default_limit_gb schema = %+v", d)
	}
	// The heartbeat's 404 is upstream's {"error": ...}, not FastAPI's.
	hb := doc.Paths.Value("/instances/{instance_id}/heartbeat").Put.Responses.Value("404").Value.Content.Get("application/json").Schema.Value
	if hb.Properties["error"] == nil {
		t.Errorf("heartbeat 404 schema = %+v", hb.Properties)
	}
}

// openAPI fetches and parses the coordinator's /openapi.json.
func (c *coord) openAPI(t *testing.T) *openapi3.T {
	t.Helper()
	code, raw := c.do("GET", "/openapi.json", nil)
	if code != 200 {
		t.Fatalf("openapi.json = %d", code)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestOpenAPIPrefetchStatusSchema: the relayed prefetch poll has a real
// schema (not an untyped object): status is required and one of the two
// spec values, the counts are integers. The spec's two bodies validate
// against it, and the documenting type marshals to exactly those bytes (the
// ones TestPrefetchRelay sees relayed).
func TestOpenAPIPrefetchStatusSchema(t *testing.T) {
	c := startCoord(t, nil)
	doc := c.openAPI(t)
	s := doc.Paths.Value("/cache/prefetches/{instance_id}/{request_id}").Get.Responses.Value("200").Value.Content.Get("application/json").Schema.Value
	if !s.Type.Is("object") || len(s.Required) != 1 || s.Required[0] != "status" {
		t.Fatalf("schema type %v required %v, want an object requiring status", s.Type, s.Required)
	}
	if st := s.Properties["status"]; st == nil || !st.Value.Type.Is("string") || fmt.Sprint(st.Value.Enum) != "[pending completed]" {
		t.Fatalf("status schema = %+v", st)
	}
	for _, n := range []string{"found_keys", "total_keys"} {
		if p := s.Properties[n]; p == nil || !p.Value.Type.Is("integer") {
			t.Fatalf("%s schema = %+v", n, p)
		}
	}
	if len(s.Properties) != 5 || s.Properties["request_id"] == nil || s.Properties["error"] == nil {
		t.Fatalf("properties %v", s.Properties)
	}
	two := 2
	for _, cs := range []struct {
		v    coordinator.PrefetchStatusResponse
		want string
	}{
		{coordinator.PrefetchStatusResponse{Status: "pending"}, `{"status":"pending"}`},
		{coordinator.PrefetchStatusResponse{Status: "completed", FoundKeys: &two, TotalKeys: &two}, `{"status":"completed","found_keys":2,"total_keys":2}`},
	} {
		raw, err := json.Marshal(cs.v)
		if err != nil || string(raw) != cs.want {
			t.Fatalf("Marshal(%+v) = %s, %v; want %s", cs.v, raw, err, cs.want)
		}
		var body any
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatal(err)
		}
		if err := s.VisitJSON(body); err != nil {
			t.Fatalf("%s does not validate against the schema: %v", raw, err)
		}
	}
	var bad any
	if err := json.Unmarshal([]byte(`{"status":"done"}`), &bad); err != nil {
		t.Fatal(err)
	}
	if err := s.VisitJSON(bad); err == nil {
		t.Fatal(`{"status":"done"} validates; the enum is not in the schema`)
	}
}

// TestOpenAPINameBounds: the request schemas state the name bounds the
// validators enforce (TestNameLengthBounds): instance_id at most
// MaxInstanceIDBytes, model_name at most ledger.MaxModelNameBytes, so the
// document's literal maxLength tags cannot drift from the constants.
func TestOpenAPINameBounds(t *testing.T) {
	c := startCoord(t, nil)
	doc := c.openAPI(t)
	cases := []struct {
		method, path, field string
		want                uint64
	}{
		{"POST", "/instances", "instance_id", coordinator.MaxInstanceIDBytes},
		{"POST", "/quota/events", "instance_id", coordinator.MaxInstanceIDBytes},
		{"POST", "/cache/prefetches", "instance_id", coordinator.MaxInstanceIDBytes},
		{"POST", "/cache/prefetches", "model_name", ledger.MaxModelNameBytes},
		{"POST", "/cache/pins", "model_name", ledger.MaxModelNameBytes},
		{"DELETE", "/cache/pins", "model_name", ledger.MaxModelNameBytes},
	}
	for _, tc := range cases {
		op := doc.Paths.Value(tc.path).GetOperation(tc.method)
		s := op.RequestBody.Value.Content["application/json"].Schema.Value
		p := s.Properties[tc.field]
		if p == nil || p.Value.MaxLength == nil || *p.Value.MaxLength != tc.want {
			t.Errorf("%s %s %s: maxLength %v, want %d", tc.method, tc.path, tc.field, p, tc.want)
		}
	}
	batch := doc.Paths.Value("/events").Post.RequestBody.Value.Content["application/json"].Schema.Value.Properties["batches"].Value.Items.Value
	if n := batch.Properties["instance_id"].Value.MaxLength; n == nil || *n != coordinator.MaxInstanceIDBytes {
		t.Errorf("POST /events batches[].instance_id maxLength %v, want %d", n, coordinator.MaxInstanceIDBytes)
	}
}
