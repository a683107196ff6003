package coordinator

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strconv"
	"strings"

	"github.com/lmcache-go/lmcache/internal/periodic"
)

// route is one API endpoint. The mux and the OpenAPI document are both
// derived from Server.routes, so they cannot drift.
type route struct {
	Method    string
	Path      string
	Tag       string
	Summary   string
	Body      string   // components/schemas name of the JSON body, "" for none
	Query     []string // optional query parameters
	Responses map[int]string
	// Hidden routes (the interactive docs pages) are served but, as in
	// FastAPI, left out of the OpenAPI document.
	Hidden bool
	// Auth routes require the bearer token when --auth-token is set. Set by
	// routeTable: every route that changes state (all but GET) and the
	// prefetch poll relay are protected; reads, probes and metrics stay
	// open.
	Auth   bool
	handle func(http.ResponseWriter, *http.Request) error
}

func (s *Server) routeTable() []route {
	v := "Validation error"
	rts := []route{
		{Method: "POST", Path: "/instances", Tag: "instances", Summary: "Register (or re-register) an MP server", Body: "RegisterRequest",
			Responses: map[int]string{200: "Registered", 422: v}, handle: s.handleRegister},
		{Method: "PUT", Path: "/instances/{instance_id}/heartbeat", Tag: "instances", Summary: "Record a liveness heartbeat",
			Responses: map[int]string{200: "Heartbeat recorded", 404: "Unknown instance; re-register"}, handle: s.handleHeartbeat},
		{Method: "DELETE", Path: "/instances/{instance_id}", Tag: "instances", Summary: "Deregister an MP server (idempotent)",
			Responses: map[int]string{204: "Deregistered (also for an unknown instance)"}, handle: s.handleDeregister},
		{Method: "GET", Path: "/instances", Tag: "instances", Summary: "List registered MP servers",
			Responses: map[int]string{200: "Fleet listed"}, handle: s.handleListInstances},
		{Method: "GET", Path: "/healthz", Tag: "health", Summary: "Coordinator liveness probe",
			Responses: map[int]string{200: "Healthy"}, handle: s.handleHealthz},
		{Method: "PUT", Path: "/quota/config", Tag: "quota", Summary: "Set the default limit for unquota'd salts", Body: "DefaultLimitRequest",
			Responses: map[int]string{200: "Default set", 400: "Unsupported tier", 422: v}, handle: s.handlePutQuotaConfig},
		{Method: "GET", Path: "/quota/config", Tag: "quota", Summary: "Read the default limit", Query: []string{"tier"},
			Responses: map[int]string{200: "Default limit", 400: "Unsupported tier", 422: v}, handle: s.handleGetQuotaConfig},
		{Method: "POST", Path: "/quota/events", Tag: "quota", Summary: "Ingest a batch of usage events", Body: "ReportUsageRequest",
			Responses: map[int]string{200: "Events processed", 400: "Unsupported tier", 413: "Body too large", 422: v}, handle: s.handleEvents},
		{Method: "POST", Path: "/events", Tag: "events", Summary: "Ingest cache-event batches through the event gate (fencing, seq dedup)",
			Responses: map[int]string{200: "Counts of applied, duplicate and stale batches", 413: "Body too large", 422: v}, handle: s.handleCacheEvents},
		{Method: "PUT", Path: "/quota/{cache_salt}", Tag: "quota", Summary: "Create or update a tenant's byte budget", Body: "SetQuotaRequest",
			Responses: map[int]string{200: "Quota applied", 400: "Invalid limit or tier", 422: v}, handle: s.handlePutQuota},
		{Method: "GET", Path: "/quota/{cache_salt}", Tag: "quota", Summary: "Read one salt's quota and usage", Query: []string{"tier"},
			Responses: map[int]string{200: "Quota and usage", 400: "Unsupported tier", 422: v}, handle: s.handleGetQuota},
		{Method: "DELETE", Path: "/quota/{cache_salt}", Tag: "quota", Summary: "Remove a salt's quota entry", Query: []string{"tier"},
			Responses: map[int]string{200: "Removed or not_found", 400: "Unsupported tier", 422: v}, handle: s.handleDeleteQuota},
		{Method: "GET", Path: "/quota", Tag: "quota", Summary: "Total usage and a per-salt breakdown", Query: []string{"tier"},
			Responses: map[int]string{200: "Usage", 400: "Unsupported tier", 422: v}, handle: s.handleListQuota},
		{Method: "POST", Path: "/cache/prefetches", Tag: "cache", Summary: "Submit a warm prefetch on a named server", Body: "PrefetchRequest",
			Responses: map[int]string{200: "Submitted or noop", 404: "Unknown instance", 502: "Server unreachable or rejected the submit", 422: v}, handle: s.handlePrefetch},
		{Method: "GET", Path: "/cache/prefetches/{instance_id}/{request_id}", Tag: "cache", Summary: "Poll a warm prefetch (relayed verbatim)",
			Responses: map[int]string{200: "Status", 404: "Unknown instance or request", 502: "Server unreachable"}, handle: s.handlePrefetchStatus},
		{Method: "POST", Path: "/cache/pins", Tag: "cache", Summary: "Pin a token sequence's keys in the L2 eviction plan", Body: "PinRequest",
			Responses: map[int]string{200: "Pinned", 400: "Token cap, bad salt/model or token out of range", 422: v}, handle: s.handlePin},
		{Method: "DELETE", Path: "/cache/pins", Tag: "cache", Summary: "Unpin a token sequence's keys", Body: "PinRequest",
			Responses: map[int]string{200: "Unpinned", 400: "Token cap, bad salt/model or token out of range", 422: v}, handle: s.handleUnpin},
		{Method: "GET", Path: "/metrics", Tag: "observability", Summary: "Prometheus metrics",
			Responses: map[int]string{200: "Prometheus text format"}, handle: s.handleMetrics},
		{Method: "GET", Path: "/openapi.json", Tag: "observability", Summary: "This OpenAPI document",
			Responses: map[int]string{200: "OpenAPI 3 document"}, handle: s.handleOpenAPI},
		{Method: "GET", Path: "/periodic-threads", Tag: "observability", Summary: "Background loops with summary counts", Query: []string{"level", "running_only", "active_only"},
			Responses: map[int]string{200: "Loops listed", 400: "Unknown level"}, handle: s.handlePeriodicList},
		{Method: "GET", Path: "/periodic-threads/{thread_name}", Tag: "observability", Summary: "One background loop's status",
			Responses: map[int]string{200: "Loop status", 404: "Unknown loop"}, handle: s.handlePeriodicGet},
		{Method: "GET", Path: "/periodic-threads-health", Tag: "observability", Summary: "Whether every critical/high loop ticks",
			Responses: map[int]string{200: "Health (check healthy)"}, handle: s.handlePeriodicHealth},
		{Method: "GET", Path: "/docs", Summary: "Swagger UI", Hidden: true, handle: docsPage(swaggerHTML)},
		{Method: "GET", Path: "/redoc", Summary: "ReDoc", Hidden: true, handle: docsPage(redocHTML)},
	}
	for i := range rts {
		// The prefetch poll is a GET, but it is relayed with the MP
		// servers' token, so leaving it open would let anyone around the
		// servers' own authentication.
		rts[i].Auth = rts[i].Method != http.MethodGet || strings.HasPrefix(rts[i].Path, "/cache/prefetches/")
		if rts[i].Auth {
			rts[i].Responses[401] = "Bearer token missing or wrong (only with --auth-token)"
		}
	}
	return rts
}

// RouteInfo names one served endpoint; Hidden ones are not in the OpenAPI
// document; Auth ones require the bearer token when --auth-token is set.
type RouteInfo struct {
	Method, Path string
	Hidden       bool
	Auth         bool
}

// Routes lists every endpoint, from the same table the mux and the OpenAPI
// document are built from.
func (s *Server) Routes() []RouteInfo {
	out := make([]RouteInfo, len(s.routes))
	for i, rt := range s.routes {
		out[i] = RouteInfo{rt.Method, rt.Path, rt.Hidden, rt.Auth}
	}
	return out
}

// authorized reports whether r carries the configured bearer token. The
// SHA-256 digests are compared in constant time, so neither the token's
// bytes nor its length can be guessed from response timing
// (subtle.ConstantTimeCompare returns early on a length mismatch).
func (s *Server) authorized(r *http.Request) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	got, want := sha256.Sum256([]byte(strings.TrimSpace(tok))), sha256.Sum256([]byte(s.cfg.AuthToken))
	return ok && subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

func (s *Server) buildHandler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes {
		h := rt.handle
		auth := rt.Auth && s.cfg.AuthToken != ""
		mux.HandleFunc(rt.Method+" "+rt.Path, func(w http.ResponseWriter, r *http.Request) {
			if auth && !s.authorized(r) {
				// Checked before the body is read: nothing of an
				// unauthenticated request is parsed or applied.
				writeError(w, withMsg(ErrUnauthorized, "missing or invalid bearer token"))
				return
			}
			if err := h(w, r); err != nil {
				writeError(w, err)
			}
		})
	}
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// FastAPI answers unknown paths and wrong methods with JSON bodies;
		// ServeMux's own replies are plain text, so decide here.
		var allow []string
		for _, m := range methods {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, p := mux.Handler(probe); p != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, ErrMethod)
			return
		}
		writeError(w, ErrNoRoute)
	})
}

// openAPI renders the OpenAPI 3 document from the route table.
func (s *Server) openAPI() map[string]any {
	paths := map[string]any{}
	for _, rt := range s.routes {
		if rt.Hidden {
			continue
		}
		item, _ := paths[rt.Path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.Path] = item
		}
		op := map[string]any{
			"summary":     rt.Summary,
			"tags":        []string{rt.Tag},
			"operationId": strings.ToLower(rt.Method) + strings.NewReplacer("/", "_", "{", "", "}", "", ".", "_").Replace(rt.Path),
		}
		var params []any
		for _, seg := range strings.Split(rt.Path, "/") {
			if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
				params = append(params, map[string]any{"name": strings.Trim(seg, "{}"), "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
			}
		}
		for _, q := range rt.Query {
			schema := map[string]any{"type": "string", "enum": []string{"l1", "l2", "all"}, "default": "l2"}
			switch q {
			case "level":
				schema = map[string]any{"type": "string", "enum": periodic.Levels}
			case "running_only", "active_only":
				schema = map[string]any{"type": "boolean", "default": false}
			}
			params = append(params, map[string]any{"name": q, "in": "query", "required": false, "schema": schema})
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		if rt.Body != "" {
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{
				"schema": map[string]any{"$ref": "#/components/schemas/" + rt.Body}}}}
		}
		resp := map[string]any{}
		for code, desc := range rt.Responses {
			resp[strconv.Itoa(code)] = map[string]any{"description": desc}
		}
		op["responses"] = resp
		if rt.Auth && s.cfg.AuthToken != "" {
			op["security"] = []map[string]any{{"bearer": []string{}}}
		}
		item[strings.ToLower(rt.Method)] = op
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": "LMCache MP Coordinator", "version": "1.0.0"},
		"paths":   paths,
		"components": map[string]any{"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}}, "schemas": map[string]any{
			"EncodedObjectKey": obj([]string{"chunk_hash_hex", "model_name", "kv_rank"}, map[string]any{
				"chunk_hash_hex": typ("string"), "model_name": typ("string"), "kv_rank": typ("integer"),
				"object_group_id": typ("integer"), "cache_salt": typ("string")}),
			"RegisterRequest": obj([]string{"ip", "http_port"}, map[string]any{
				"ip": typ("string"), "http_port": typ("integer"), "instance_id": typ("string"),
				"metadata":           map[string]any{"type": "object", "additionalProperties": typ("string")},
				"p2p_advertised_url": typ("string"), "mq_port": typ("integer")}),
			"DefaultLimitRequest": obj(nil, map[string]any{"default_limit_gb": map[string]any{"type": []string{"number", "null"}, "minimum": 0}, "tier": typ("string")}),
			"SetQuotaRequest":     obj([]string{"limit_gb"}, map[string]any{"limit_gb": map[string]any{"type": "number", "minimum": 0}, "tier": typ("string")}),
			"UsageEvent": obj([]string{"type", "key", "bytes"}, map[string]any{
				"type": map[string]any{"type": "string", "enum": []string{"store", "lookup", "delete"}},
				"key":  map[string]any{"$ref": "#/components/schemas/EncodedObjectKey"}, "bytes": map[string]any{"type": "integer", "minimum": 0}}),
			"ReportUsageRequest": obj([]string{"instance_id", "seq", "events"}, map[string]any{
				"instance_id": typ("string"), "seq": map[string]any{"type": "integer", "minimum": 1}, "tier": typ("string"),
				"events": map[string]any{"type": "array", "items": map[string]any{"$ref": "#/components/schemas/UsageEvent"}}}),
			"PrefetchRequest": obj([]string{"instance_id", "model_name", "world_size"}, map[string]any{
				"instance_id": typ("string"), "model_name": typ("string"), "world_size": map[string]any{"type": "integer", "minimum": 1},
				"token_ids": map[string]any{"type": "array", "items": typ("integer")}, "cache_salt": typ("string")}),
			"PinRequest": obj([]string{"model_name", "world_size"}, map[string]any{
				"model_name": typ("string"), "world_size": map[string]any{"type": "integer", "minimum": 1},
				"token_ids": map[string]any{"type": "array", "items": typ("integer"), "maxItems": maxTokenIDs}, "cache_salt": typ("string")}),
		}},
	}
}

func typ(t string) map[string]any { return map[string]any{"type": t} }

func obj(required []string, props map[string]any) map[string]any {
	o := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, s.openAPI())
	return nil
}

// truthy is the query flag test /periodic-threads uses on the MP server.
func truthy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on", "t", "y":
		return true
	}
	return false
}

func (s *Server) handlePeriodicList(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var level periodic.Level
	if q.Has("level") {
		l, err := periodic.ParseLevel(q.Get("level"))
		if err != nil {
			return badRequest("Invalid level: %s. Valid values: critical, high, medium, low", q.Get("level"))
		}
		level = l
	}
	running, active := truthy(q.Get("running_only")), truthy(q.Get("active_only"))
	all := s.loops.All()
	threads := []periodic.Status{}
	for _, t := range all {
		if level != "" && t.Level != level || running && !t.IsRunning || active && !t.IsActive {
			continue
		}
		threads = append(threads, t)
	}
	writeJSON(w, http.StatusOK, map[string]any{"summary": periodic.Summarize(all), "threads": threads})
	return nil
}

func (s *Server) handlePeriodicGet(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("thread_name")
	st, ok := s.loops.Get(name)
	if !ok {
		return withMsg(ErrUnknownThread, "Thread not found: %s", name)
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (s *Server) handlePeriodicHealth(w http.ResponseWriter, _ *http.Request) error {
	bad := periodic.Unhealthy(s.loops.All())
	list := make([]map[string]any, 0, len(bad))
	for _, t := range bad {
		list = append(list, map[string]any{"name": t.Name, "level": t.Level, "last_run_ago": t.LastRunAgo, "interval": t.Interval})
	}
	writeJSON(w, http.StatusOK, map[string]any{"healthy": len(bad) == 0, "unhealthy_count": len(bad), "unhealthy_threads": list})
	return nil
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) error {
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}

// The interactive docs pages FastAPI serves at /docs and /redoc. Like
// FastAPI's, they load their scripts from a public CDN and read
// /openapi.json.
const swaggerHTML = `<!DOCTYPE html>
<html><head><title>LMCache MP Coordinator - Swagger UI</title>
<link type="text/css" rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css">
</head><body><div id="swagger-ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: '/openapi.json', dom_id: '#swagger-ui'})</script>
</body></html>
`

const redocHTML = `<!DOCTYPE html>
<html><head><title>LMCache MP Coordinator - ReDoc</title><meta charset="utf-8"></head>
<body><redoc spec-url="/openapi.json"></redoc>
<script src="https://cdn.jsdelivr.net/npm/redoc@2/bundles/redoc.standalone.js"></script>
</body></html>
`

func docsPage(html string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(html))
		return nil
	}
}
