// Package webui serves the operator console at /ui: one static page with
// plain JavaScript and the vendored uPlot chart library, all embedded in the
// binary (no request leaves for another origin, so it works offline). The
// page reads the service's existing JSON and /metrics routes with the
// bearer token the operator types in; the assets themselves are public,
// since they hold no data.
package webui

import (
	"bytes"
	"embed"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/httproute"
)

// assets holds the page, its script and style, and uPlot's dist files with
// its licence (version pinned by assets/package-lock.json).
//
//go:embed assets/console.js assets/console.css assets/vendor/uplot/uPlot.iife.min.js assets/vendor/uplot/uPlot.min.css assets/vendor/uplot/LICENSE
var assets embed.FS

// indexHTML is the page, with {{SERVICE}} where the service name goes.
//
//go:embed assets/index.html
var indexHTML []byte

// Service names the binary the console runs in; the page shows the panels
// of that service.
type Service string

// The two services.
const (
	Server      Service = "server"
	Coordinator Service = "coordinator"
)

// Prefix is the path the console lives under.
const Prefix = "/ui"

// files maps a URL name under /ui/ to its embedded file and content type.
var files = map[string]struct{ path, ctype string }{
	"console.js":        {"assets/console.js", "text/javascript; charset=utf-8"},
	"console.css":       {"assets/console.css", "text/css; charset=utf-8"},
	"uPlot.iife.min.js": {"assets/vendor/uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"},
	"uPlot.min.css":     {"assets/vendor/uplot/uPlot.min.css", "text/css; charset=utf-8"},
	"uPlot.LICENSE.txt": {"assets/vendor/uplot/LICENSE", "text/plain; charset=utf-8"},
}

// csp keeps the page to its own origin: scripts and styles from /ui, data
// from the service's routes. uPlot sizes its canvas with style attributes,
// hence 'unsafe-inline' for styles only.
const csp = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves GET /ui (the page) and GET /ui/{file} (its assets) for svc.
// Any other name under /ui/ is 404.
type Handler struct {
	page []byte
	// built is the modification time reported for every asset (the
	// binary's start; embedded files carry none).
	built time.Time
}

// New returns the console handler for svc.
func New(svc Service) *Handler {
	return &Handler{page: bytes.ReplaceAll(indexHTML, []byte("{{SERVICE}}"), []byte(svc)), built: time.Now()}
}

// errNoAsset is an unknown name under /ui/: the toolkit's 404, so both
// services answer it as any unknown path, FastAPI's {"detail": "Not Found"}.
var errNoAsset = httproute.Errorf(httproute.ErrNoRoute, "Not Found")

// ServeHTTP serves the page at /ui and /ui/, and the named assets; an
// unknown name is a JSON 404 {"detail": "Not Found"}.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.Serve(w, r); err != nil {
		httproute.WriteJSON(w, http.StatusNotFound, httproute.DetailBody{Detail: httproute.Message(err)})
	}
}

// Serve is ServeHTTP for route tables whose handlers return an error: an
// unknown name returns an error wrapping httproute.ErrNoRoute, which the
// table writes as its 404 (nothing is written here then).
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request) error {
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cache-Control", "no-cache")
	name := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, Prefix), "/")
	if name == "" || name == "index.html" {
		hd.Set("Content-Type", "text/html; charset=utf-8")
		http.ServeContent(w, r, "index.html", h.built, bytes.NewReader(h.page))
		return nil
	}
	f, ok := files[path.Clean(name)]
	if !ok || path.Clean(name) != name {
		return errNoAsset
	}
	b, err := assets.ReadFile(f.path)
	if err != nil {
		// Only a name listed in files but missing from the embed (a
		// build mistake) gets here; to the client it is still unknown.
		return errNoAsset
	}
	hd.Set("Content-Type", f.ctype)
	http.ServeContent(w, r, name, h.built, bytes.NewReader(b))
	return nil
}
