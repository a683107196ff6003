package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestOpenAPIValidatesWithSchemas: GET /openapi.json loads and validates
// as OpenAPI 3 (kin-openapi), holds every registered route with every
// documented status, each response with a schema (204 aside), and a
// request-body schema on every route that reads a body.
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
	if doc.OpenAPI != "3.0.3" || doc.Info.Title != "LMCache HTTP API" {
		t.Fatalf("openapi %q title %q", doc.OpenAPI, doc.Info.Title)
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
