package httpapi

import (
	"context"
	"errors"
	"net/http"
	"sort"

	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/httproute/docsui"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/webui"
)

// authMode says when a route requires the bearer token.
type authMode int

const (
	authOpen    authMode = iota // probes, version strings, loop health
	authAlways                  // cached content, configuration, tenant names, state changes
	authOnSet                   // only when the request mutates (loglevel with level=)
	authMetrics                 // GET /metrics: only with Options.ProtectMetrics
	authDebug                   // pprof: the token when set, else loopback clients only
)

// authNames are the RouteInfo.Auth strings, indexed by authMode; the route
// table in docs/security.md uses the same words.
var authNames = [...]string{"never", "always", "when setting", "opt-in", "always; loopback only without a token"}

// route is one entry of the route table; the mux and /openapi.json are both
// derived from routes().
type route struct {
	method  string
	path    string // OpenAPI path, with {params}
	tag     string
	summary string
	auth    authMode
	shape   shape
	// statuses are the documented status codes with a description each.
	statuses map[int]string
	// body describes the request body for OpenAPI ("" = none).
	body string
	// query lists query parameters with their types.
	query []httproute.Param
	// produces is the success content type (default application/json).
	produces string
	// req and resp are values of the request and success body types, from
	// which /openapi.json's schemas are generated.
	req, resp any
	// hidden routes (the interactive docs pages) are served but, as in
	// FastAPI, neither in /openapi.json nor in Routes().
	hidden bool
	h      func(s *Server, w http.ResponseWriter, r *http.Request) error
}

const (
	ctJSON   = httproute.JSON
	ctText   = httproute.Text
	ctBinary = httproute.Binary
	ctForm   = httproute.Form
)

func routes() []route {
	st := func(kv ...any) map[int]string {
		m := map[int]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(int)] = kv[i+1].(string)
		}
		return m
	}
	const (
		notInit = "engine not initialized"
		val     = "request body or query fails validation"
		unauth  = "bearer token missing or wrong (only with --http-auth-token)"
	)
	ui := webui.New(webui.Server)
	rs := []route{
		// Liveness and health.
		{method: "GET", path: "/", tag: "info", summary: "Static liveness ping (does not touch the engine).", statuses: st(200, "alive"), resp: RootResponse{}, h: (*Server).handleRoot},
		{method: "GET", path: "/healthcheck", tag: "info", summary: "Readiness probe; 503 until the engine is ready.", statuses: st(200, "healthy", 503, notInit), resp: HealthResponse{}, h: (*Server).handleHealth},
		// Inspection.
		{method: "GET", path: "/status", tag: "info", shape: shapeError, auth: authAlways, summary: "Engine snapshot: engine fields, storage manager, contexts, sessions, prefetch jobs.", statuses: st(200, "status", 503, notInit), resp: StatusResponse{}, h: (*Server).handleStatus},
		{method: "GET", path: "/api/status", tag: "info", shape: shapeError, auth: authAlways, summary: "GET /status under newer upstream's path (its KV SDK reads chunk_size here).", statuses: st(200, "status", 503, notInit), resp: StatusResponse{}, h: (*Server).handleStatus},
		{method: "GET", path: "/config", tag: "config", shape: shapeError, auth: authAlways, summary: "Merged server configuration (mp, storage_manager, observability).", statuses: st(200, "configuration", 503, "configs not initialized"), resp: ConfigResponse{}, h: (*Server).handleConfig},
		{method: "GET", path: "/config/adapters", tag: "config", auth: authAlways, summary: "Live L2 adapters in configuration order.", statuses: st(200, "adapters", 503, notInit), resp: AdaptersResponse{}, h: (*Server).handleConfigAdapters},
		{method: "GET", path: "/version", tag: "info", summary: "Combined version string \"<version>-<commit>\".", statuses: st(200, "version"), resp: "", h: (*Server).handleVersion},
		{method: "GET", path: "/lmc_version", tag: "info", summary: "Package version string.", statuses: st(200, "version"), resp: "", h: (*Server).handleLMCVersion},
		{method: "GET", path: "/commit_id", tag: "info", summary: "Build commit id.", statuses: st(200, "commit"), resp: "", h: (*Server).handleCommitID},
		// Cache management.
		{method: "GET", path: "/cache/objects", tag: "cache", auth: authAlways, summary: "Paginate objects resident in an L2 adapter.", query: []httproute.Param{{Name: "tier", Enum: []string{"l1", "l2", "all"}, Default: "l2"}, {Name: "adapter"}, {Name: "model_name"},
			{Name: "page_size", Type: "integer", Default: defaultPage, Min: httproute.Bound(1), Max: httproute.Bound(maxPage)}, {Name: "page_token"}},
			statuses: st(200, "page", 400, "unsupported tier or malformed page_token", 404, "unknown adapter", 422, "page_size outside [1, 5000]", 501, "adapter cannot list", 503, "engine not initialized or no L2 adapters"), resp: ObjectPage{}, h: (*Server).handleListObjects},
		{method: "DELETE", path: "/cache/objects", tag: "cache", auth: authAlways, body: ctJSON, summary: "Delete a list of object keys from a tier/adapter.",
			statuses: st(200, "reached the adapter (check ok)", 400, "too many keys or an invalid key", 404, "unknown adapter", 422, val, 503, "engine not initialized or no L2 adapters"), req: DeleteObjectsRequest{}, resp: DeleteObjectsResponse{}, h: (*Server).handleDeleteObjects},
		{method: "POST", path: "/cache/prefetches", tag: "cache", auth: authAlways, body: ctJSON, summary: "Warm L1 from L2 for a token sequence.",
			statuses: st(202, "submitted or noop", 400, "token cap, bad cache_salt or direction", 409, "no layout registered for (model_name, world_size)", 422, val, 503, notInit), req: PrefetchRequest{}, resp: PrefetchSubmitResponse{}, h: (*Server).handleSubmitPrefetch},
		{method: "GET", path: "/cache/prefetches/{request_id}", tag: "cache", auth: authAlways, summary: "Poll a warm prefetch; completion is reported once.",
			statuses: st(200, "pending or completed", 404, "unknown or already consumed request_id", 503, notInit), resp: PrefetchPollResponse{}, h: (*Server).handlePollPrefetch},
		{method: "POST", path: "/cache/clear", tag: "cache", auth: authAlways, body: ctJSON, summary: "Force-clear the L1 tier.",
			statuses: st(200, "cleared", 400, "unsupported tier", 422, val, 503, "server not initialized"), req: ClearRequest{}, resp: ClearResponse{}, h: (*Server).handleClear},
		{method: "POST", path: "/cache/checksums", tag: "cache", shape: shapeDetail, auth: authAlways, body: ctJSON, summary: "MD5 per chunk over registered KV blocks.",
			statuses: st(200, "checksums", 400, "block_ids empty or chunk_size not positive", 404, "instance not registered or KV tensors empty", 422, val, 501, "no KV contexts or unsupported KV format", 503, notInit), req: ChecksumRequest{}, resp: ChecksumResponse{}, h: (*Server).handleChecksums},
		// Bytes-level KV API.
		{method: "POST", path: "/api/kv/store", tag: "kv", auth: authAlways, body: ctBinary, summary: "Store KV for a token sequence. Newer upstream's framed form (application/x-lmcache-kv-stream; v=1, also any body without routing headers): a store_manifest frame {model_name, tokens, cache_salt, shape, dtype}, then one store_chunk frame per full chunk. Older upstream's form: headers X-LMCache-Model-Name, X-LMCache-Tokens, X-LMCache-Cache-Salt and a KV_2LTD tensor body (application/x-lmcache-kv; v=1). Ours: X-LMCache-Model instead, and a body of raw per-chunk, per-rank objects. X-LMCache-World-Size picks one of several layouts.",
			statuses: st(200, "stored", 400, "bad headers, tokens, salt, body length or framing; model not registered", 413, "body too large (over the per-request limit or the whole in-flight KV budget)", 503, notInit+", or the in-flight KV budget is taken (Retry-After; nothing stored)"), req: "", resp: KVStoreResponse{}, h: (*Server).handleKVStore},
		{method: "POST", path: "/api/kv/retrieve", tag: "kv", auth: authAlways, body: ctJSON, summary: "Return the longest cached prefix as bytes; hit counts in X-LMCache-* headers. The request is a JSON body {model_name, tokens, cache_salt, world_size, protocol_version} or, without a JSON content type, the X-LMCache-* headers. With Accept: application/x-lmcache-kv-stream or a protocol_version (newer upstream), the answer is framed: a retrieve_manifest frame, then one retrieve_shard frame per (chunk, worker), 200 also on a miss. Otherwise X-LMCache-Model-Name or a JSON body answer a KV_2LTD tensor (application/x-lmcache-kv; v=1) and X-LMCache-Model raw objects.",
			produces: ctBinary, statuses: st(200, "prefix bytes", 400, "bad headers, tokens, model or salt; model not registered", 404, "no chunk cached (the tensor form: empty body, hit headers; the framed form answers 200)", 413, "body too large", 422, val, 503, notInit+", or the in-flight KV budget is taken (Retry-After)"), req: KVRequest{}, h: (*Server).handleKVRetrieve},
		{method: "POST", path: "/api/kv/lookup", tag: "kv", auth: authAlways, body: ctJSON, summary: "Report how much of a token sequence is cached (JSON body or X-LMCache-* headers, as retrieve).",
			statuses: st(200, "hit counts", 400, "bad headers, tokens, model or salt; model not registered", 413, "body too large", 422, val, 503, notInit), req: KVRequest{}, resp: KVLookupResponse{}, h: (*Server).handleKVLookup},
		// Quota.
		{method: "GET", path: "/quota", tag: "quota", shape: shapeError, auth: authAlways, summary: "Every registered cache_salt quota with live usage.", statuses: st(200, "quotas", 503, notInit), resp: QuotaListResponse{}, h: (*Server).handleQuotaList},
		{method: "PUT", path: "/quota/{cache_salt}", tag: "quota", shape: shapeError, auth: authAlways, body: ctJSON, summary: "Set a cache_salt quota in GB (_default = empty salt).",
			statuses: st(200, "set", 400, "invalid limit_gb, or a cache_salt no store can carry", 503, notInit), req: QuotaPutRequest{}, resp: QuotaPutResponse{}, h: (*Server).handleQuotaPut},
		{method: "GET", path: "/quota/{cache_salt}", tag: "quota", shape: shapeError, auth: authAlways, summary: "One cache_salt's quota and usage (never 404).", statuses: st(200, "quota", 503, notInit), resp: QuotaGetResponse{}, h: (*Server).handleQuotaGet},
		{method: "DELETE", path: "/quota/{cache_salt}", tag: "quota", shape: shapeError, auth: authAlways, summary: "Remove a cache_salt quota.", statuses: st(200, "removed or not_found", 503, notInit), resp: QuotaDeleteResponse{}, h: (*Server).handleQuotaDelete},
		// Runtime L2 reconfiguration.
		{method: "GET", path: "/reconfigure/{backend}/status", tag: "reconfigure", shape: shapeError, auth: authAlways, summary: "Runtime-manageable adapters of one backend type.",
			statuses: st(200, "status (also for unknown backends)", 400, "empty backend", 503, notInit), resp: ReconfigureStatusResponse{}, h: (*Server).handleReconfigureStatus},
		{method: "POST", path: "/reconfigure/{backend}/{operation}", tag: "reconfigure", shape: shapeError, auth: authAlways, body: ctJSON, summary: "Apply one reconfiguration (dax: add, remove, resize).",
			statuses: st(200, "backend result", 400, "empty backend/operation, unsupported operation or invalid size", 404, "adapter_index out of range", 409, "operation conflicts with the adapter state", 422, val, 503, notInit), req: ReconfigureRequest{}, resp: ReconfigureResponse{}, h: (*Server).handleReconfigure},
		// Observability.
		{method: "GET", path: "/metrics", tag: "observability", auth: authMetrics, summary: "Prometheus exposition.", produces: ctText, statuses: st(200, "metrics"), h: (*Server).handleMetrics},
		{method: "POST", path: "/metrics/reset", tag: "observability", auth: authAlways, summary: "Reset observability metrics.", produces: ctText, statuses: st(200, "ok"), h: (*Server).handleMetricsReset},
		// Diagnostics.
		{method: "GET", path: "/loglevel", tag: "diagnostics", shape: shapeText, auth: authOnSet, summary: "List, read or (with level=) set per-logger levels.", query: []httproute.Param{{Name: "logger_name"}, {Name: "level"}}, produces: ctText,
			statuses: st(200, "levels", 400, "unknown level"), h: (*Server).handleLogLevel},
		{method: "GET", path: "/threads", tag: "diagnostics", shape: shapeText, auth: authAlways, summary: "Goroutine stacks; name= filters on pprof labels, thread_id= on goroutine id.", query: []httproute.Param{{Name: "name"}, {Name: "thread_id", Type: "integer"}}, produces: ctText,
			statuses: st(200, "stacks"), h: (*Server).handleThreads},
		{method: "GET", path: "/periodic-threads", tag: "diagnostics", shape: shapeError, summary: "Registered periodic loops with summary counts.", query: httproute.PeriodicQuery(),
			statuses: st(200, "snapshot", 400, "unknown level"), resp: periodic.Listing{}, h: loops(func(p httproute.PeriodicHandlers) handler { return p.List })},
		{method: "GET", path: "/periodic-threads/{thread_name}", tag: "diagnostics", shape: shapeError, summary: "One periodic loop.", statuses: st(200, "status", 404, "unknown loop"), resp: periodic.Status{}, h: loops(func(p httproute.PeriodicHandlers) handler { return p.Get })},
		{method: "GET", path: "/periodic-threads-health", tag: "diagnostics", summary: "Health of critical and high loops (always 200).", statuses: st(200, "health"), resp: periodic.Health{}, h: loops(func(p httproute.PeriodicHandlers) handler { return p.Health })},
		{method: "GET", path: "/env", tag: "diagnostics", auth: authAlways, summary: "Process environment (secret-looking values redacted).", produces: ctText, statuses: st(200, "environment"), h: (*Server).handleEnv},
		{method: "POST", path: "/run_script", tag: "diagnostics", shape: shapeText, auth: authAlways, body: ctForm, summary: "Run a Starlark script (field script) in a bounded sandbox; off unless --run-script-api-enabled.", produces: ctText,
			statuses: st(200, "result", 400, "no script file provided", 404, "run_script disabled", 408, "request body not received within the read deadline", 413, "script over 1 MiB", 500, "script failed"), req: ScriptForm{}, h: (*Server).handleRunScript},
		{method: "GET", path: "/openapi.json", tag: "info", summary: "This document.", statuses: st(200, "OpenAPI 3 document"), resp: OpenAPIDocument{}, h: (*Server).handleOpenAPI},
		{method: "GET", path: "/docs", summary: "Swagger UI over /openapi.json.", hidden: true, produces: httproute.HTML, statuses: st(200, "page"),
			h: docsPage(func() string { return docsui.Swagger("LMCache HTTP API", "/openapi.json") })},
		{method: "GET", path: "/redoc", summary: "ReDoc over /openapi.json.", hidden: true, produces: httproute.HTML, statuses: st(200, "page"),
			h: docsPage(func() string { return docsui.Redoc("LMCache HTTP API", "/openapi.json") })},
		// The operator console (internal/webui), beyond upstream: static, so
		// open; the data it fetches goes through the routes above with the token.
		{method: "GET", path: "/ui", tag: "info", summary: "Web console page.", produces: httproute.HTML, statuses: st(200, "page"), h: uiRoute(ui)},
		{method: "GET", path: "/ui/{file}", tag: "info", summary: "Web console asset (script, style, the chart library and its licence).", produces: ctText,
			statuses: st(200, "asset", 404, "unknown asset"), h: uiRoute(ui)},
	}
	// Go profiling (net/http/pprof), beyond upstream: the route set both
	// services share, which documents its own 403 (the loopback rule).
	for i, p := range pprofRoutes.Routes() {
		rs = append(rs, route{method: p.Method, path: p.Path, tag: p.Tag, auth: authDebug, summary: p.Summary, statuses: p.Statuses,
			body: p.RequestType, query: p.Query, produces: p.Produces, req: p.Request, h: pprofRoute(i)})
	}
	// Every guarded route documents 401, so the OpenAPI document cannot
	// forget one.
	for i := range rs {
		switch rs[i].auth {
		case authOpen:
			continue
		case authOnSet:
			rs[i].statuses[401] = unauth + " (setting only)"
		case authMetrics:
			rs[i].statuses[401] = unauth + " (only with LMCACHE_HTTP_AUTH_PROTECT_METRICS=1)"
		default:
			rs[i].statuses[401] = unauth
		}
	}
	// Every route that reads a JSON or binary body bounds the time the
	// client has to send it.
	for i := range rs {
		if rs[i].body == ctJSON || rs[i].body == ctBinary {
			rs[i].statuses[408] = "request body not received within the read deadline"
		}
	}
	return rs
}

// handler is the toolkit's handler signature.
type handler = func(http.ResponseWriter, *http.Request) error

// loops serves one of the toolkit's shared /periodic-threads handlers over
// the server's registry (an unknown loop is ErrNotFound's 404).
func loops(pick func(httproute.PeriodicHandlers) handler) func(*Server, http.ResponseWriter, *http.Request) error {
	return func(s *Server, w http.ResponseWriter, r *http.Request) error {
		return pick(httproute.Periodic(s.loops, ErrNotFound))(w, r)
	}
}

// pprofRoutes documents the shared pprof routes; pprof binds them to a
// server's token.
var pprofRoutes = httproute.Pprof{Tag: "diagnostics", TokenFlag: "--http-auth-token"}

// pprof is the shared pprof route set with s's token, 403 sentinel and
// secret scrubbing (the redacted command line also has the configured
// secret values replaced).
func (s *Server) pprof() httproute.Pprof {
	p := pprofRoutes
	p.Token, p.Forbidden, p.Scrub = s.opts.AuthToken, ErrForbidden, s.scrub
	return p
}

// pprofRoute serves the i-th shared pprof route bound to the server.
func pprofRoute(i int) func(*Server, http.ResponseWriter, *http.Request) error {
	return func(s *Server, w http.ResponseWriter, r *http.Request) error {
		return s.pprof().Routes()[i].Handle(w, r)
	}
}

// uiRoute serves the web console; an unknown asset is returned as the
// toolkit's ErrNoRoute, so the table writes FastAPI's JSON 404.
func uiRoute(ui *webui.Handler) func(*Server, http.ResponseWriter, *http.Request) error {
	return func(_ *Server, w http.ResponseWriter, r *http.Request) error { return ui.Serve(w, r) }
}

// docsPage serves an interactive docs page (docsui), built on first use.
func docsPage(build func() string) func(*Server, http.ResponseWriter, *http.Request) error {
	h := docsui.Handler(build)
	return func(_ *Server, w http.ResponseWriter, r *http.Request) error { return h(w, r) }
}

// toolkitRoute turns a table entry into the toolkit's route, bound to s.
func (s *Server) toolkitRoute(rt route) httproute.Route {
	out := httproute.Route{
		Method: rt.method, Path: rt.path, Tag: rt.tag, Summary: rt.summary, Shape: rt.shape,
		Request: rt.req, RequestType: rt.body, Response: rt.resp, Produces: rt.produces,
		Statuses: rt.statuses, Hidden: rt.hidden, Handle: func(w http.ResponseWriter, r *http.Request) error { return rt.h(s, w, r) },
	}
	out.Query = rt.query
	switch rt.auth {
	case authAlways:
		out.Auth = httproute.Bearer
	case authOnSet:
		out.Auth = httproute.Bearer
		out.AuthWhen = func(r *http.Request) bool { return httproute.Query(r).Get("level") != "" }
	case authMetrics:
		out.Auth = httproute.Bearer
		out.AuthWhen = func(*http.Request) bool { return s.opts.ProtectMetrics }
	case authDebug:
		out.Auth = httproute.Bearer
		out.Check = s.pprof().Check
	}
	return out
}

// buildTable builds the toolkit table: the mux with FastAPI's 404/405,
// auth, recovery, error bodies and /openapi.json.
func (s *Server) buildTable() (*httproute.Table, error) {
	var rs []httproute.Route
	for _, rt := range routes() {
		rs = append(rs, s.toolkitRoute(rt))
	}
	return httproute.New(httproute.Config{
		Title: "LMCache HTTP API", Version: s.opts.Version,
		Token:                  s.opts.AuthToken,
		Errors:                 httproute.Errors{Statuses: statusMap, Realm: "lmcache"},
		DocumentSecurityAlways: true,
		Log:                    s.log,
		OnError: func(r *http.Request, _ *httproute.Route, code int, err error) error {
			msg := s.scrub(err.Error())
			switch {
			case code < 500 || code == http.StatusServiceUnavailable || code == http.StatusNotImplemented:
			case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
				// The client went away (a lookup it stopped waiting for):
				// nothing failed on the server, and an ERROR line per
				// cancelled request is a false alarm.
				s.log.Debug("http request abandoned by its client", "method", r.Method, "path", r.URL.Path, "err", msg)
			default:
				s.log.Error("http request failed", "method", r.Method, "path", r.URL.Path, "status", code, "err", msg)
			}
			// The body shows the whole chain's text, with the configured
			// secrets replaced; the status is still the wrapped error's.
			return &httproute.Error{Kind: err, Msg: msg}
		},
	}, rs)
}

// RouteInfo describes one route of the table (for documentation and
// conformance tests).
type RouteInfo struct {
	Method string
	// Path is the OpenAPI path; Pattern the ServeMux pattern.
	Path, Pattern string
	// Auth is "never", "always", "when setting" (loglevel), "opt-in"
	// (metrics) or "always; loopback only without a token" (pprof).
	Auth string
	// Statuses are the documented status codes, sorted.
	Statuses []int
	// ErrorShape is the error body convention: "detail" ({"detail": ...}),
	// "error" ({"error": ...}) or "text" (text/plain).
	ErrorShape string
	// Body is the request body's content type ("" = none).
	Body string
}

// Routes lists every documented route the server serves (all but the
// hidden docs pages).
func Routes() []RouteInfo { return routeInfos(false) }

// ServedRoutes is Routes plus the hidden docs pages (/docs, /redoc): every
// route the server answers, for checks that must cover them all, such as
// docs/security.md's protection table.
func ServedRoutes() []RouteInfo { return routeInfos(true) }

func routeInfos(withHidden bool) []RouteInfo {
	var out []RouteInfo
	for _, rt := range routes() {
		if rt.hidden && !withHidden {
			continue
		}
		tr := httproute.Route{Method: rt.method, Path: rt.path}
		ri := RouteInfo{Method: rt.method, Path: rt.path, Pattern: tr.Pattern(), Auth: authNames[rt.auth], ErrorShape: rt.shape.String(), Body: rt.body}
		for c := range rt.statuses {
			ri.Statuses = append(ri.Statuses, c)
		}
		sort.Ints(ri.Statuses)
		out = append(out, ri)
	}
	return out
}
