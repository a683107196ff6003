package httpapi_test

import (
	"strings"
	"testing"
)

// TestWebConsoleRoutes checks the console's two routes on the MP server:
// the page, one embedded asset with its content type, and 404 for a name
// that is not one of the listed assets (FastAPI's {"detail":"Not Found"},
// as for any unknown path). The routes are open even with a
// token (the data the page fetches goes through the guarded routes).
func TestWebConsoleRoutes(t *testing.T) {
	e := start(t, envOpts{noEngine: true})
	page := e.expect(200, "GET", "/ui", nil)
	if !strings.Contains(string(page.body), "console.js") {
		t.Fatalf("GET /ui does not load console.js: %.200s", page.body)
	}
	js := e.expect(200, "GET", "/ui/console.js", nil)
	if ct := js.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") || len(js.body) == 0 {
		t.Fatalf("GET /ui/console.js: Content-Type %q, %d bytes", ct, len(js.body))
	}
	nf := e.expect(404, "GET", "/ui/package.json", nil)
	if string(nf.body) != `{"detail":"Not Found"}` || nf.header.Get("Content-Type") != "application/json" {
		t.Fatalf("unknown asset: %q (%s), want FastAPI's JSON 404", nf.body, nf.header.Get("Content-Type"))
	}
}
