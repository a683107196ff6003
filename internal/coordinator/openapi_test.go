package coordinator_test

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
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
