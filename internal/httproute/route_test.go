package httproute_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/httproute"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errGone = errors.New("gone")

type item struct {
	Name  string   `json:"name" maxLength:"64"`
	Size  int64    `json:"size_bytes"`
	Tags  []string `json:"tags,omitempty"`
	Level string   `json:"level" enum:"low,high"`
}

type itemList struct {
	Items []item  `json:"items"`
	Next  *string `json:"next_page_token"`
}

type badField struct{ items []httproute.ValidationItem }

func (b badField) Error() string { return "bad field" }
func (b badField) Detail() any   { return b.items }

func table(t *testing.T, token string) *httproute.Table {
	t.Helper()
	var tb *httproute.Table
	routes := []httproute.Route{
		{Method: "GET", Path: "/", Summary: "root", Response: map[string]string{}, Statuses: map[int]string{200: "ok"},
			Handle: func(w http.ResponseWriter, r *http.Request) error {
				httproute.WriteJSON(w, 200, map[string]string{"ok": "1"})
				return nil
			}},
		{Method: "GET", Path: "/items/{name}", Auth: httproute.Bearer, Shape: httproute.ShapeError, Response: item{},
			Statuses: map[int]string{200: "the item", 404: "unknown"}, Query: []httproute.Param{{Name: "tier", Enum: []string{"l1", "l2"}}},
			Handle: func(w http.ResponseWriter, r *http.Request) error {
				if r.PathValue("name") == "x" {
					return httproute.Errorf(errGone, "no item %s", r.PathValue("name"))
				}
				httproute.WriteJSON(w, 200, item{Name: r.PathValue("name")})
				return nil
			}},
		{Method: "PUT", Path: "/items/{name}", Auth: httproute.Bearer, Request: item{}, Response: itemList{},
			Statuses: map[int]string{200: "stored", 413: "too large", 422: "invalid"},
			Handle: func(w http.ResponseWriter, r *http.Request) error {
				var buf bytes.Buffer
				if err := httproute.ReadBody(&buf, w, r, 16, 0); err != nil {
					return err
				}
				if buf.Len() == 0 {
					return badField{[]httproute.ValidationItem{{Loc: []any{"body"}, Msg: "Field required", Type: "missing"}}}
				}
				httproute.WriteJSON(w, 200, itemList{Items: []item{}})
				return nil
			}},
		{Method: "GET", Path: "/level", Auth: httproute.Bearer, AuthWhen: func(r *http.Request) bool { return r.URL.Query().Has("set") },
			Shape: httproute.ShapeText, Produces: httproute.Text, Statuses: map[int]string{200: "level"},
			Handle: func(w http.ResponseWriter, r *http.Request) error {
				if r.URL.Query().Has("boom") {
					panic("boom")
				}
				httproute.WriteText(w, 200, "info")
				return nil
			}},
		{Method: "GET", Path: "/openapi.json", Statuses: map[int]string{200: "this document"},
			Handle: func(w http.ResponseWriter, r *http.Request) error { return tb.ServeOpenAPI(w, r) }},
		{Method: "GET", Path: "/docs", Hidden: true, Produces: httproute.HTML, Statuses: map[int]string{200: "page"},
			Handle: func(w http.ResponseWriter, r *http.Request) error { httproute.WriteText(w, 200, "docs"); return nil }},
	}
	tb, err := httproute.New(httproute.Config{
		Title: "test", Version: "1", Token: token,
		Errors: httproute.Errors{Realm: "test", Statuses: httproute.StatusMap{{Status: 404, Errs: []error{errGone}}}},
	}, routes)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

type reply struct {
	code int
	body string
	hdr  http.Header
}

func call(t *testing.T, srv *httptest.Server, method, path, token, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(b), resp.Header}
}

// TestFallbacksAuthAndErrors: FastAPI's 404 and 405 (with Allow) bodies,
// the bearer check with WWW-Authenticate, per-request auth (AuthWhen), the
// sentinel table, error shapes, 422 lists, body limits and panic recovery,
// over a real listener.
func TestFallbacksAuthAndErrors(t *testing.T) {
	tb := table(t, "s3cret")
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	for _, c := range []struct {
		method, path, token, body string
		code                      int
		want                      string
	}{
		{"GET", "/", "", "", 200, `{"ok":"1"}`},
		{"GET", "/nope", "", "", 404, `{"detail":"Not Found"}`},
		{"PATCH", "/items/a", "", "", 405, `{"detail":"Method Not Allowed"}`},
		{"GET", "/items/a", "", "", 401, `{"error":"missing or invalid bearer token"}`},
		{"GET", "/items/a", "s3cre", "", 401, `{"error":"missing or invalid bearer token"}`},
		{"GET", "/items/a", "s3cret", "", 200, `{"name":"a","size_bytes":0,"level":""}`},
		{"GET", "/items/x", "s3cret", "", 404, `{"error":"no item x"}`},
		{"PUT", "/items/a", "s3cret", "", 422, `{"detail":[{"loc":["body"],"msg":"Field required","type":"missing"}]}`},
		{"PUT", "/items/a", "s3cret", strings.Repeat("x", 17), 413, `{"detail":"request body exceeds 16 bytes"}`},
		{"PUT", "/items/a", "s3cret", "x", 200, `{"items":[],"next_page_token":null}`},
		{"GET", "/level", "", "", 200, "info"},
		{"GET", "/level?set=1", "", "", 401, "missing or invalid bearer token"},
		{"GET", "/level?boom=1", "", "", 500, "internal error: boom"},
	} {
		r := call(t, srv, c.method, c.path, c.token, c.body)
		if r.code != c.code || r.body != c.want {
			t.Errorf("%s %s = %d %s, want %d %s", c.method, c.path, r.code, r.body, c.code, c.want)
		}
		if c.code == 401 && r.hdr.Get("WWW-Authenticate") != `Bearer realm="test"` {
			t.Errorf("%s %s: WWW-Authenticate %q", c.method, c.path, r.hdr.Get("WWW-Authenticate"))
		}
	}
	if r := call(t, srv, "DELETE", "/items/a", "", ""); r.hdr.Get("Allow") != "GET, PUT" {
		t.Errorf("Allow = %q", r.hdr.Get("Allow"))
	}
}

// TestOpenAPIFromTypes: the document validates as OpenAPI 3, lists every
// route but the hidden one, and carries schemas generated from the Go
// types (required fields, enums, nullable pointers) for every request and
// response.
func TestOpenAPIFromTypes(t *testing.T) {
	tb := table(t, "")
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	r := call(t, srv, "GET", "/openapi.json", "", "")
	if r.code != 200 {
		t.Fatalf("openapi.json = %d", r.code)
	}
	doc, err := openapi3.NewLoader().LoadFromData([]byte(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("invalid OpenAPI document: %v", err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi = %q", doc.OpenAPI)
	}
	for _, rt := range tb.Routes() {
		op := doc.Paths.Find(rt.Path)
		if rt.Hidden {
			if op != nil {
				t.Errorf("hidden %s in the document", rt.Path)
			}
			continue
		}
		if op == nil || op.GetOperation(rt.Method) == nil {
			t.Fatalf("%s %s missing", rt.Method, rt.Path)
		}
		o := op.GetOperation(rt.Method)
		if o.Responses.Len() != len(rt.Statuses) {
			t.Errorf("%s %s: %d responses, want %d", rt.Method, rt.Path, o.Responses.Len(), len(rt.Statuses))
		}
		for code, resp := range o.Responses.Map() {
			if len(resp.Value.Content) != 1 {
				t.Errorf("%s %s %s: content %v", rt.Method, rt.Path, code, resp.Value.Content)
			}
			for _, mt := range resp.Value.Content {
				if mt.Schema == nil || mt.Schema.Value == nil {
					t.Errorf("%s %s %s: no schema", rt.Method, rt.Path, code)
				}
			}
		}
	}
	get := doc.Paths.Find("/items/{name}").Get
	s := get.Responses.Value("200").Value.Content["application/json"].Schema.Value
	if got := strings.Join(s.Required, ","); got != "name,size_bytes,level" {
		t.Errorf("required = %q", got)
	}
	if lv := s.Properties["level"].Value; len(lv.Enum) != 2 || lv.Enum[1] != "high" {
		t.Errorf("level enum = %v", lv.Enum)
	}
	if n := s.Properties["name"].Value.MaxLength; n == nil || *n != 64 {
		t.Errorf("name maxLength = %v, want 64 (from the maxLength tag)", n)
	}
	if e := get.Responses.Value("404").Value.Content["application/json"].Schema.Value; e.Properties["error"] == nil {
		t.Errorf("404 schema is not the error shape: %v", e.Properties)
	}
	if tier := get.Parameters.GetByInAndName("query", "tier"); tier == nil || len(tier.Schema.Value.Enum) != 2 {
		t.Errorf("tier param = %+v", tier)
	}
	put := doc.Paths.Find("/items/{name}").Put
	if rb := put.RequestBody.Value.Content["application/json"].Schema.Value; rb.Properties["size_bytes"] == nil {
		t.Errorf("request schema = %+v", rb.Properties)
	}
	next := put.Responses.Value("200").Value.Content["application/json"].Schema.Value.Properties["next_page_token"].Value
	if !next.Nullable {
		t.Errorf("next_page_token not nullable")
	}
	if lvl := doc.Paths.Find("/level").Get.Responses.Value("200").Value.Content["text/plain"]; lvl == nil || !lvl.Schema.Value.Type.Is("string") {
		t.Errorf("text response schema = %+v", lvl)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.body), &raw); err != nil {
		t.Fatal(err)
	}
}

// TestConflictingRoutesFailAtNew: a duplicate pattern is an error from
// New, not a panic in the service.
func TestConflictingRoutesFailAtNew(t *testing.T) {
	h := func(http.ResponseWriter, *http.Request) error { return nil }
	_, err := httproute.New(httproute.Config{}, []httproute.Route{
		{Method: "GET", Path: "/a", Handle: h}, {Method: "GET", Path: "/a", Handle: h},
	})
	if err == nil || !strings.Contains(err.Error(), "/a") {
		t.Fatalf("err = %v", err)
	}
}

// TestHideInternal: with HideInternal an unmapped error (and a recovered
// panic) is a bare text 500 that shows nothing of the error; the document
// says so per status.
func TestHideInternal(t *testing.T) {
	tb, err := httproute.New(httproute.Config{Errors: httproute.Errors{HideInternal: true}}, []httproute.Route{
		{Method: "GET", Path: "/fail", Statuses: map[int]string{200: "ok", 500: "internal"}, Handle: func(http.ResponseWriter, *http.Request) error {
			return errors.New("db password is hunter2")
		}},
		{Method: "GET", Path: "/panic", Handle: func(http.ResponseWriter, *http.Request) error { panic("hunter2") }},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	for _, p := range []string{"/fail", "/panic"} {
		if r := call(t, srv, "GET", p, "", ""); r.code != 500 || r.body != "Internal Server Error" || !strings.HasPrefix(r.hdr.Get("Content-Type"), "text/plain") {
			t.Errorf("%s = %d %q %q", p, r.code, r.body, r.hdr.Get("Content-Type"))
		}
	}
	doc, err := tb.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	if c := doc.Paths.Find("/fail").Get.Responses.Value("500").Value.Content; c["text/plain"] == nil {
		t.Errorf("500 documented as %v", c)
	}
}
