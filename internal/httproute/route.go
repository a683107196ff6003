// Package httproute is the HTTP toolkit both services (the MP server's
// operator API and the coordinator) are built on: one route table per
// service drives the net/http ServeMux, the FastAPI-style 404/405
// fallbacks, bearer-token auth, panic recovery, the sentinel→status
// mapping and error bodies, and the OpenAPI 3 document, whose schemas are
// generated from the Go request and response types of each route
// (kin-openapi). A route cannot be served without being documented, or
// documented without being served.
package httproute

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"
)

// Auth says whether a route requires the bearer token (when the service
// has one configured).
type Auth int

const (
	// Open routes never ask for the token (probes, version strings).
	Open Auth = iota
	// Bearer routes require "Authorization: Bearer <token>" when a token
	// is configured; Route.AuthWhen may narrow that to some requests.
	Bearer
)

// Content types used by route tables.
const (
	JSON   = "application/json"
	Text   = "text/plain"
	Binary = "application/octet-stream"
	Form   = "multipart/form-data"
	HTML   = "text/html"
)

// Param is one query parameter.
type Param struct {
	Name string
	// Type is the JSON Schema type: "string" (default), "integer",
	// "boolean", "number".
	Type string
	Enum []string
	// Default is documented only.
	Default any
	// Required parameters are documented as such (handlers still check).
	Required bool
	// Min and Max, when set, document an integer or number's inclusive
	// range (handlers still check).
	Min, Max *float64
}

// Bound returns a pointer to v, for Param.Min and Param.Max.
func Bound(v float64) *float64 { return &v }

// Route is one endpoint: how it is served and how it is documented.
type Route struct {
	Method  string
	Path    string // OpenAPI path with {params}; "/" matches only itself
	Tag     string
	Summary string
	Auth    Auth
	// AuthWhen, if set on a Bearer route, requires the token only for the
	// requests it returns true for (a GET that also sets, an opt-in).
	AuthWhen func(*http.Request) bool
	// Check runs after auth and before the handler; an error is answered
	// as any handler error (pprof's loopback-only rule).
	Check func(*http.Request) error
	// Shape is the error-body convention (default ShapeDetail).
	Shape Shape
	// StatusShapes documents the statuses whose body shape differs from
	// Shape (an error kind whose StatusRule names its own shape).
	StatusShapes map[int]Shape
	// Request is a value of the JSON body's Go type, or a string/[]byte
	// for a text or binary body; nil means no body. RequestType is its
	// content type (default JSON).
	Request     any
	RequestType string
	// Response is a value of the success body's Go type; Produces its
	// content type (default JSON). A nil Response with a text or binary
	// Produces is documented as a string.
	Response any
	Produces string
	// Statuses are the documented status codes with a description each;
	// the success ones carry Response, the others the error shape.
	Statuses map[int]string
	Query    []Param
	// Hidden routes are served but, as in FastAPI, left out of the
	// document (the interactive docs pages).
	Hidden bool
	// Handle serves the request; a returned error is mapped to a status by
	// the service's StatusMap and written in the route's Shape.
	Handle func(http.ResponseWriter, *http.Request) error
}

// Pattern is the ServeMux pattern of the route.
func (rt *Route) Pattern() string {
	p := rt.Path
	if p == "/" {
		p = "/{$}"
	}
	return rt.Method + " " + p
}

// NeedsToken reports whether r must carry the token on this route (given
// that one is configured).
func (rt *Route) NeedsToken(r *http.Request) bool {
	if rt.Auth != Bearer {
		return false
	}
	return rt.AuthWhen == nil || rt.AuthWhen(r)
}

// Config is what a service supplies besides its routes.
type Config struct {
	// Title and Version head the OpenAPI document; an empty Version is
	// documented as UnknownVersion, since OpenAPI requires one.
	Title, Version string
	// Token, when non-empty, guards Bearer routes.
	Token string
	// Errors maps and writes the service's errors.
	Errors Errors
	// DocumentSecurityAlways marks Bearer routes as secured in the document
	// even when no token is configured (otherwise only with a token).
	DocumentSecurityAlways bool
	// OnError sees every handler error with its status before it is
	// written and returns the error to write (to log it, scrub secrets
	// from its message). Nil writes err as is.
	OnError func(r *http.Request, rt *Route, code int, err error) error
	// Log, if set, gets a DEBUG access line per request and an ERROR line
	// with the stack for a recovered panic.
	Log *slog.Logger
}

// Table is a service's served and documented routes.
type Table struct {
	cfg     Config
	routes  []Route
	digest  [sha256.Size]byte
	handler http.Handler
	// doc is the marshalled OpenAPI document, built once by New (the
	// table and the token do not change).
	doc []byte
}

// fallbackMethods are probed, in this order, for a 405's Allow header.
var fallbackMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch}

// New builds the table's handler. Routes are checked here: a duplicate or
// malformed pattern is a programming error reported at startup.
func New(cfg Config, routes []Route) (t *Table, err error) {
	t = &Table{cfg: cfg, routes: routes, digest: sha256.Sum256([]byte(cfg.Token))}
	mux := http.NewServeMux()
	defer func() {
		// ServeMux panics on conflicting patterns.
		if v := recover(); v != nil {
			t, err = nil, fmt.Errorf("httproute: %v", v)
		}
	}()
	for i := range t.routes {
		rt := &t.routes[i]
		if rt.Handle == nil {
			return nil, fmt.Errorf("httproute: %s has no handler", rt.Pattern())
		}
		mux.Handle(rt.Pattern(), t.serve(rt))
	}
	doc, err := t.OpenAPI()
	if err != nil {
		return nil, err
	}
	if t.doc, err = json.Marshal(doc); err != nil {
		return nil, fmt.Errorf("httproute: encode OpenAPI document: %w", err)
	}
	t.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// ServeMux's own 404/405 are plain text; FastAPI answers JSON,
		// with Allow listing the methods the path does have.
		var allow []string
		for _, m := range fallbackMethods {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, p := mux.Handler(probe); p != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			t.WriteError(w, ShapeDetail, Errorf(ErrMethod, "Method Not Allowed"))
			return
		}
		t.WriteError(w, ShapeDetail, Errorf(ErrNoRoute, "Not Found"))
	})
	return t, nil
}

// Handler is the service's HTTP handler.
func (t *Table) Handler() http.Handler { return t.handler }

// Routes returns the table (the caller must not modify it).
func (t *Table) Routes() []Route { return t.routes }

// Authorized reports whether r carries the configured token. Both sides are
// hashed first: subtle.ConstantTimeCompare returns at once on a length
// mismatch, which would tell a prober the token's length.
func (t *Table) Authorized(r *http.Request) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return ok && subtle.ConstantTimeCompare(got[:], t.digest[:]) == 1
}

// Status maps err to its HTTP status (see Errors.Status).
func (t *Table) Status(err error) int { return t.cfg.Errors.Status(err) }

// WriteError writes err (see Errors.Write).
func (t *Table) WriteError(w http.ResponseWriter, shape Shape, err error) {
	t.cfg.Errors.Write(w, shape, err)
}

// statusWriter remembers the status for the access log.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (body
// read deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (t *Table) serve(rt *Route) http.Handler {
	shape := rt.Shape
	if shape == ShapeRoute {
		shape = ShapeDetail
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := &statusWriter{ResponseWriter: rw}
		if t.cfg.Log != nil {
			start := time.Now()
			defer func() {
				t.cfg.Log.Debug("http request", "method", r.Method, "path", r.URL.Path, "route", rt.Path, "status", w.code,
					"duration_ms", float64(time.Since(start).Microseconds())/1000, "remote", r.RemoteAddr)
			}()
		}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				if t.cfg.Log != nil {
					t.cfg.Log.Error("http handler panic", "route", rt.Path, "panic", v, "stack", string(debug.Stack()))
				}
				t.fail(w, r, rt, shape, Errorf(ErrPanic, "internal error: %v", v))
			}
		}()
		// Checked before the body is read: nothing of an unauthenticated
		// request is parsed or applied.
		if t.cfg.Token != "" && rt.NeedsToken(r) && !t.Authorized(r) {
			t.WriteError(w, shape, Errorf(ErrUnauthorized, "missing or invalid bearer token"))
			return
		}
		if rt.Check != nil {
			if err := rt.Check(r); err != nil {
				t.fail(w, r, rt, shape, err)
				return
			}
		}
		if err := rt.Handle(w, r); err != nil {
			t.fail(w, r, rt, shape, err)
		}
	})
}

func (t *Table) fail(w http.ResponseWriter, r *http.Request, rt *Route, shape Shape, err error) {
	if t.cfg.OnError != nil {
		err = t.cfg.OnError(r, rt, t.Status(err), err)
	}
	t.WriteError(w, shape, err)
}
