// Package docsui serves the interactive API pages FastAPI offers, /docs
// (Swagger UI) and /redoc (ReDoc), over a service's /openapi.json. The
// bundles are vendored from npm (swagger-ui-dist and redoc, the exact
// versions pinned by assets/package-lock.json, with their licence files)
// and embedded in the binary, and each page inlines them, so a page makes
// no request to any other host and needs no extra route; a
// Content-Security-Policy header keeps the browser from trying.
//
// To update: change the versions in assets/package.json, run
// `npm install --package-lock-only --ignore-scripts` there, then
// `npm pack swagger-ui-dist@<v> redoc@<v>` and copy swagger-ui-bundle.js,
// swagger-ui.css, redoc.standalone.js and the LICENSE/NOTICE files over.
package docsui

import (
	_ "embed"
	"encoding/json"
	"html"
	"net/http"
	"strings"
	"sync"
)

var (
	//go:embed assets/swagger-ui-bundle.js
	swaggerJS string
	//go:embed assets/swagger-ui.css
	swaggerCSS string
	//go:embed assets/redoc.standalone.js
	redocJS string
)

// csp allows only the page itself (inline scripts and styles, data:
// images, the spec from the same origin, ReDoc's blob: worker).
const csp = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:; connect-src 'self'; worker-src blob:"

// Swagger returns the Swagger UI page for the spec at specURL (a path on
// the same origin).
func Swagger(title, specURL string) string {
	url, _ := json.Marshal(specURL)
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>")
	b.WriteString(html.EscapeString(title))
	b.WriteString(" - Swagger UI</title>\n<style>")
	b.WriteString(swaggerCSS)
	b.WriteString("</style>\n</head><body><div id=\"swagger-ui\"></div>\n<script>")
	b.WriteString(swaggerJS)
	// validatorUrl null: the stock page would fetch a badge from
	// validator.swagger.io.
	b.WriteString("</script>\n<script>SwaggerUIBundle({url: " + string(url) + ", dom_id: '#swagger-ui', validatorUrl: null})</script>\n</body></html>\n")
	return b.String()
}

// Redoc returns the ReDoc page for the spec at specURL.
func Redoc(title, specURL string) string {
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>")
	b.WriteString(html.EscapeString(title))
	b.WriteString(" - ReDoc</title></head>\n<body><redoc spec-url=\"")
	b.WriteString(html.EscapeString(specURL))
	b.WriteString("\"></redoc>\n<script>")
	b.WriteString(redocJS)
	b.WriteString("</script>\n</body></html>\n")
	return b.String()
}

// Handler serves the page build returns (Swagger or Redoc), built on the
// first request: the pages are megabytes a server that nobody browses
// should not hold.
func Handler(build func() string) func(http.ResponseWriter, *http.Request) error {
	page := sync.OnceValue(func() []byte { return []byte(build()) })
	return func(w http.ResponseWriter, _ *http.Request) error {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", csp)
		_, _ = w.Write(page())
		return nil
	}
}
