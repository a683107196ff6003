package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/lmcache-go/lmcache/internal/buildinfo"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/httproute"
)

// freeFormBodies are the only bodies documented as free-form objects (no
// properties, any members), each with why: a new route with an untyped
// body fails TestOpenAPIValidatesWithSchemas until it is typed or added
// here.
var freeFormBodies = map[string]string{
	"GET /openapi.json 200": "the OpenAPI document itself; its schema is the OpenAPI specification",
}

// TestOpenAPIUnstampedVersion: a binary built without version stamping and
// without VCS information (GOFLAGS=-buildvcs=false) has no version; the
// document still validates, with upstream's "NA" as info.version, while
// /lmc_version stays upstream's empty string.
func TestOpenAPIUnstampedVersion(t *testing.T) {
	saved := buildinfo.Version
	buildinfo.Version = ""
	t.Cleanup(func() { buildinfo.Version = saved })
	e := start(t, envOpts{noEngine: true, mutate: func(o *httpapi.Options) { o.Version = "" }})
	raw := e.expect(200, "GET", "/openapi.json", nil).body
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("/openapi.json of an unstamped build is not valid OpenAPI 3: %v", err)
	}
	if doc.Info.Version != "NA" {
		t.Fatalf("info.version %q, want NA", doc.Info.Version)
	}
	if v := string(e.expect(200, "GET", "/lmc_version", nil).body); v != `""` {
		t.Fatalf("/lmc_version = %s, want \"\"", v)
	}
}

// TestOpenAPIValidatesWithSchemas: GET /openapi.json loads and validates
// as OpenAPI 3 (kin-openapi), holds every registered route with every
// documented status, each response with a schema (204 aside), and a
// request-body schema on every route that reads a body, and a typed schema
// on every query parameter (integers and booleans not as strings). No body
// is a free-form object except those freeFormBodies names.
func TestOpenAPIValidatesWithSchemas(t *testing.T) {
	e := start(t, envOpts{noEngine: true})
	raw := e.expect(200, "GET", "/openapi.json", nil).body
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("/openapi.json is not valid OpenAPI 3: %v", err)
	}
	if doc.OpenAPI != "3.0.3" || doc.Info.Title != "LMCache HTTP API" || doc.Info.Version != "0.3.1" {
		t.Fatalf("openapi %q title %q version %q", doc.OpenAPI, doc.Info.Title, doc.Info.Version)
	}
	freeSeen := map[string]bool{}
	for _, key := range httproute.FreeFormBodies(doc) {
		freeSeen[key] = true
		if _, ok := freeFormBodies[key]; !ok {
			t.Errorf("%s: free-form object schema (type the body, or name it in freeFormBodies)", key)
		}
	}
	routes := httpapi.Routes()
	ops := 0
	for _, item := range doc.Paths.Map() {
		ops += len(item.Operations())
	}
	if ops != len(routes) {
		t.Errorf("document has %d operations, the table %d routes", ops, len(routes))
	}
	for _, r := range routes {
		item := doc.Paths.Value(r.Path)
		if item == nil || item.GetOperation(r.Method) == nil {
			t.Errorf("%s %s missing", r.Method, r.Path)
			continue
		}
		op := item.GetOperation(r.Method)
		for _, code := range r.Statuses {
			resp := op.Responses.Value(strconv.Itoa(code))
			if resp == nil {
				t.Errorf("%s %s: status %d undocumented", r.Method, r.Path, code)
				continue
			}
			if len(resp.Value.Content) == 0 {
				t.Errorf("%s %s %d: no response schema", r.Method, r.Path, code)
			}
			for ct, mt := range resp.Value.Content {
				if mt.Schema == nil || mt.Schema.Value == nil || mt.Schema.Value.Type == nil {
					t.Errorf("%s %s %d %s: untyped schema", r.Method, r.Path, code, ct)
				}
			}
		}
		if r.Body != "" {
			if op.RequestBody == nil || op.RequestBody.Value.Content.Get(r.Body) == nil || op.RequestBody.Value.Content.Get(r.Body).Schema == nil {
				t.Errorf("%s %s: no %s request schema", r.Method, r.Path, r.Body)
			}
		}
	}
	for key := range freeFormBodies {
		if !freeSeen[key] {
			t.Errorf("freeFormBodies names %s, which is not a free-form body (drop it from the list)", key)
		}
	}
	// The bodies typed from map[string]any: their schemas list the fields.
	props := func(method, path, code string) map[string]bool {
		op := doc.Paths.Value(path).GetOperation(method)
		var sc *openapi3.Schema
		if code == "request" {
			sc = op.RequestBody.Value.Content.Get("application/json").Schema.Value
		} else {
			sc = op.Responses.Value(code).Value.Content.Get("application/json").Schema.Value
		}
		out := map[string]bool{}
		for k := range sc.Properties {
			out[k] = true
		}
		return out
	}
	for _, c := range []struct {
		method, path, code string
		fields             []string
	}{
		{"GET", "/status", "200", []string{"is_healthy", "engine_type", "chunk_size", "hash_algorithm", "active_sessions", "registered_gpu_ids", "cache_context_meta", "active_prefetch_jobs", "storage_manager", "model_layouts"}},
		{"GET", "/api/status", "200", []string{"is_healthy", "storage_manager", "model_layouts"}},
		{"GET", "/config", "200", []string{"mp", "storage_manager", "observability"}},
		{"POST", "/reconfigure/{backend}/{operation}", "request", []string{"adapter_index", "device_path", "size", "mode", "force"}},
		{"POST", "/reconfigure/{backend}/{operation}", "200", []string{"adapter_index", "operation", "status"}},
		{"GET", "/reconfigure/{backend}/status", "200", []string{"adapters", "backend", "enabled", "num_adapters"}},
	} {
		got := props(c.method, c.path, c.code)
		for _, f := range c.fields {
			if !got[f] {
				t.Errorf("%s %s %s: schema lacks %q (has %v)", c.method, c.path, c.code, f, got)
			}
		}
	}
	// Query parameters carry their types: every one is typed, and the
	// numeric and boolean ones are not documented as strings.
	want := map[string]string{
		"GET /cache/objects page_size": "integer", "GET /threads thread_id": "integer",
		"GET /periodic-threads running_only": "boolean", "GET /periodic-threads active_only": "boolean",
		"GET /debug/pprof/profile seconds": "integer", "GET /debug/pprof/trace seconds": "integer",
		"GET /cache/objects tier": "string", "GET /periodic-threads level": "string", "GET /loglevel logger_name": "string",
	}
	seen := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for _, p := range op.Parameters {
				if p.Value.In != "query" {
					continue
				}
				key := method + " " + path + " " + p.Value.Name
				sc := p.Value.Schema
				if sc == nil || sc.Value == nil || sc.Value.Type == nil || len(*sc.Value.Type) != 1 {
					t.Errorf("%s: untyped query parameter", key)
					continue
				}
				if w, ok := want[key]; ok {
					seen++
					if !sc.Value.Type.Is(w) {
						t.Errorf("%s: type %v, want %s", key, *sc.Value.Type, w)
					}
				}
			}
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of the %d checked query parameters", seen, len(want))
	}
	var pageSize *openapi3.Schema
	for _, p := range doc.Paths.Value("/cache/objects").Get.Parameters {
		if p.Value.Name == "page_size" {
			pageSize = p.Value.Schema.Value
		}
	}
	if pageSize == nil || pageSize.Min == nil || *pageSize.Min != 1 || pageSize.Max == nil || *pageSize.Max != 5000 || pageSize.Default != float64(500) {
		t.Errorf("page_size schema = %+v", pageSize)
	}
	var level *openapi3.Schema
	for _, p := range doc.Paths.Value("/periodic-threads").Get.Parameters {
		if p.Value.Name == "level" {
			level = p.Value.Schema.Value
		}
	}
	if level == nil || len(level.Enum) != 4 {
		t.Errorf("periodic level schema = %+v", level)
	}

	// Schemas come from the Go types: spot-check two.
	page := doc.Paths.Value("/cache/objects").Get.Responses.Value("200").Value.Content.Get("application/json").Schema.Value
	if next := page.Properties["next_page_token"]; next == nil || !next.Value.Nullable || !next.Value.Type.Is("string") {
		t.Errorf("ObjectPage.next_page_token schema = %+v", next)
	}
	del := doc.Paths.Value("/cache/objects").Delete.RequestBody.Value.Content.Get("application/json").Schema.Value
	if keys := del.Properties["keys"]; keys == nil || keys.Value.Items.Value.Properties["chunk_hash_hex"] == nil || len(del.Required) != 1 || del.Required[0] != "keys" {
		t.Errorf("DeleteObjectsRequest schema = %+v required %v", del.Properties, del.Required)
	}
	if tier := del.Properties["tier"].Value; len(tier.Enum) != 3 {
		t.Errorf("tier enum = %v", tier.Enum)
	}
}

// TestDocsPagesServed: /docs and /redoc are served open (without the
// token even when one is configured) as local-only pages over
// /openapi.json, and are neither in the document nor in Routes(), as in
// FastAPI.
func TestDocsPagesServed(t *testing.T) {
	e := start(t, envOpts{noEngine: true, mutate: func(o *httpapi.Options) { o.AuthToken = "docs-tok" }})
	for path, marker := range map[string]string{"/docs": `url: "/openapi.json"`, "/redoc": `spec-url="/openapi.json"`} {
		resp, err := http.Get(e.base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), marker) || resp.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("%s: %d, page without %s or CSP", path, resp.StatusCode, marker)
		}
		for _, rt := range httpapi.Routes() {
			if rt.Path == path {
				t.Errorf("%s in Routes()", path)
			}
		}
	}
}
