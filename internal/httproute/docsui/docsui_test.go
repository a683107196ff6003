package docsui_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httproute/docsui"
)

// inline matches the bodies of inline scripts and styles: the bundles'
// own code, not markup the page loads.
// The bundles hold no "</script" and the stylesheet no "</style", so the
// first closing tag ends each block.
var inline = regexp.MustCompile(`(?s)<script>.*?</script>|<style>.*?</style>`)

// htmlRefs finds every resource an HTML page itself loads (src=, href=,
// spec-url=, stylesheet links).
var htmlRefs = regexp.MustCompile(`(?i)<(?:script|link|img|iframe)[^>]*\s(?:src|href)\s*=\s*"([^"]*)"|spec-url="([^"]*)"`)

// TestPagesReferenceOnlyLocalPaths: over a real listener, /docs and
// /redoc pages load nothing from another host (the bundles are inline; the
// only reference is the same-origin /openapi.json), carry a CSP that
// forbids other origins, and hold the vendored bundles.
func TestPagesReferenceOnlyLocalPaths(t *testing.T) {
	mux := http.NewServeMux()
	for path, build := range map[string]func() string{
		"/docs":  func() string { return docsui.Swagger("LMCache <API>", "/openapi.json") },
		"/redoc": func() string { return docsui.Redoc("LMCache <API>", "/openapi.json") },
	} {
		h := docsui.Handler(build)
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { _ = h(w, r) })
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for path, marker := range map[string]string{"/docs": "SwaggerUIBundle", "/redoc": "Redoc"} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page := string(b)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("%s = %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("%s CSP = %q", path, csp)
		}
		if len(page) < 1<<20 || !strings.Contains(page, marker) {
			t.Errorf("%s: %d bytes, bundle missing", path, len(page))
		}
		if !strings.Contains(page, "<title>LMCache &lt;API&gt; - ") {
			t.Errorf("%s: title not escaped", path)
		}
		refs := 0
		markup := inline.ReplaceAllString(page, "")
		if len(markup) > 1000 {
			t.Errorf("%s: %d bytes of markup outside the inline bundles", path, len(markup))
		}
		for _, m := range htmlRefs.FindAllStringSubmatch(markup, -1) {
			ref := m[1] + m[2]
			refs++
			if !strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, "//") {
				t.Errorf("%s references %q", path, ref)
			}
		}
		if path == "/redoc" && refs != 1 {
			t.Errorf("%s: %d references, want only spec-url", path, refs)
		}
		if path == "/docs" && !strings.Contains(page, `url: "/openapi.json"`) {
			t.Errorf("/docs does not load /openapi.json")
		}
	}
}
