package coordinator

import (
	"net/http"
	"slices"
	"strings"

	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/httproute/docsui"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/webui"
)

// route is one API endpoint of the table the toolkit serves and
// documents (so the mux and /openapi.json cannot drift).
type route = httproute.Route

func (s *Server) routeTable() []route {
	v := "Validation error"
	tier := []httproute.Param{{Name: "tier", Enum: []string{"l1", "l2", "all"}, Default: "l2"}}
	ui := webui.New(webui.Coordinator)
	pf := newPrefetchTracker() // the console's view of relayed prefetches (console.go)
	loops := httproute.Periodic(s.loops, ErrUnknownThread)
	rts := []route{
		{Method: "POST", Path: "/instances", Tag: "instances", Summary: "Register (or re-register) an MP server", Request: RegisterRequest{},
			Statuses: map[int]string{200: "Registered", 422: v, 503: "Registry full (a new instance past 100,000 or 64 MiB of registrations)"}, Response: RegisterResponse{}, Handle: s.handleRegister},
		{Method: "PUT", Path: "/instances/{instance_id}/heartbeat", Tag: "instances", Summary: "Record a liveness heartbeat", StatusShapes: map[int]httproute.Shape{404: httproute.ShapeError},
			Statuses: map[int]string{200: "Heartbeat recorded", 404: "Unknown instance; re-register"}, Response: HeartbeatResponse{}, Handle: s.handleHeartbeat},
		{Method: "DELETE", Path: "/instances/{instance_id}", Tag: "instances", Summary: "Deregister an MP server (idempotent)",
			Statuses: map[int]string{204: "Deregistered (also for an unknown instance)"}, Handle: s.handleDeregister},
		{Method: "GET", Path: "/instances", Tag: "instances", Summary: "List registered MP servers",
			Statuses: map[int]string{200: "Fleet listed"}, Response: InstancesResponse{}, Handle: s.handleListInstances},
		{Method: "GET", Path: "/healthz", Tag: "health", Summary: "Coordinator liveness probe",
			Statuses: map[int]string{200: "Healthy"}, Response: HealthzResponse{}, Handle: s.handleHealthz},
		{Method: "PUT", Path: "/quota/config", Tag: "quota", Summary: "Set the default limit for unquota'd salts", Request: DefaultLimitRequest{},
			Statuses: map[int]string{200: "Default set", 400: "Unsupported tier", 422: v}, Response: DefaultLimitResponse{}, Handle: s.handlePutQuotaConfig},
		{Method: "GET", Path: "/quota/config", Tag: "quota", Summary: "Read the default limit", Query: tier,
			Statuses: map[int]string{200: "Default limit", 400: "Unsupported tier", 422: v}, Response: DefaultLimitResponse{}, Handle: s.handleGetQuotaConfig},
		{Method: "POST", Path: "/quota/events", Tag: "quota", Summary: "Ingest a batch of usage events", Request: ReportUsageRequest{},
			Statuses: map[int]string{200: "Events processed", 400: "Unsupported tier", 413: "Body too large", 422: v}, Response: RecordedResponse{}, Handle: s.handleEvents},
		{Method: "POST", Path: "/events", Tag: "events", Summary: "Ingest cache-event batches through the event gate (fencing, seq dedup)", Request: CacheEventsRequest{},
			Statuses: map[int]string{200: "Counts of applied, duplicate and stale batches", 413: "Body too large", 422: v}, Response: CacheEventsResponse{}, Handle: s.handleCacheEvents},
		{Method: "PUT", Path: "/quota/{cache_salt}", Tag: "quota", Summary: "Create or update a tenant's byte budget", Request: SetQuotaRequest{},
			Statuses: map[int]string{200: "Quota applied", 400: "Invalid limit or tier, or a new cache_salt while 100,000 quotas are registered", 422: v}, Response: QuotaResponse{}, Handle: s.handlePutQuota},
		{Method: "GET", Path: "/quota/{cache_salt}", Tag: "quota", Summary: "Read one salt's quota and usage", Query: tier,
			Statuses: map[int]string{200: "Quota and usage", 400: "Unsupported tier", 422: v}, Response: saltStatus{}, Handle: s.handleGetQuota},
		{Method: "DELETE", Path: "/quota/{cache_salt}", Tag: "quota", Summary: "Remove a salt's quota entry", Query: tier,
			Statuses: map[int]string{200: "Removed or not_found", 400: "Unsupported tier", 422: v}, Response: QuotaResponse{}, Handle: s.handleDeleteQuota},
		{Method: "GET", Path: "/quota", Tag: "quota", Summary: "Total usage and a per-salt breakdown", Query: tier,
			Statuses: map[int]string{200: "Usage", 400: "Unsupported tier", 422: v}, Response: UsageResponse{}, Handle: s.handleListQuota},
		{Method: "POST", Path: "/cache/prefetches", Tag: "cache", Summary: "Submit a warm prefetch on a named server", Request: PrefetchRequest{},
			Statuses: map[int]string{200: "Submitted or noop", 404: "Unknown instance", 502: "Server unreachable or rejected the submit", 422: v}, Response: prefetchResponse{}, Handle: pf.trackSubmit(s.handlePrefetch)},
		{Method: "GET", Path: "/cache/prefetches/{instance_id}/{request_id}", Tag: "cache", Summary: "Poll a warm prefetch (relayed verbatim)",
			Statuses: map[int]string{200: "Status", 404: "Unknown instance or request", 502: "Server unreachable"}, Response: PrefetchStatusResponse{}, Handle: pf.trackPoll(s.handlePrefetchStatus)},
		{Method: "POST", Path: "/cache/pins", Tag: "cache", Summary: "Pin a token sequence's keys in the L2 eviction plan", Request: PinRequest{},
			Statuses: map[int]string{200: "Pinned", 400: "Token cap, bad salt/model or token out of range", 422: v}, Response: pinResponse{}, Handle: s.handlePin},
		{Method: "DELETE", Path: "/cache/pins", Tag: "cache", Summary: "Unpin a token sequence's keys", Request: PinRequest{},
			Statuses: map[int]string{200: "Unpinned", 400: "Token cap, bad salt/model or token out of range", 422: v}, Response: pinResponse{}, Handle: s.handleUnpin},
		{Method: "GET", Path: "/metrics", Tag: "observability", Summary: "Prometheus metrics",
			Statuses: map[int]string{200: "Prometheus text format"}, Produces: httproute.Text, Handle: s.handleMetrics},
		{Method: "GET", Path: "/openapi.json", Tag: "observability", Summary: "This OpenAPI document",
			Statuses: map[int]string{200: "OpenAPI 3 document"}, Response: map[string]any{}, Handle: s.handleOpenAPI},
		{Method: "GET", Path: "/periodic-threads", Tag: "observability", Summary: "Background loops with summary counts", Query: httproute.PeriodicQuery(),
			Statuses: map[int]string{200: "Loops listed", 400: "Unknown level"}, Response: periodic.Listing{}, Handle: loops.List},
		{Method: "GET", Path: "/periodic-threads/{thread_name}", Tag: "observability", Summary: "One background loop's status", StatusShapes: map[int]httproute.Shape{404: httproute.ShapeError},
			Statuses: map[int]string{200: "Loop status", 404: "Unknown loop"}, Response: periodic.Status{}, Handle: loops.Get},
		{Method: "GET", Path: "/config", Tag: "observability", Summary: "Running configuration and where each value came from (secrets hidden)",
			Statuses: map[int]string{200: "Settings and their _sources"}, Response: ConfigResponse{}, Handle: s.handleConfig},
		{Method: "GET", Path: "/periodic-threads-health", Tag: "observability", Summary: "Whether every critical/high loop ticks",
			Statuses: map[int]string{200: "Health (check healthy)"}, Response: periodic.Health{}, Handle: loops.Health},
		{Method: "GET", Path: "/docs", Summary: "Swagger UI", Hidden: true, Produces: httproute.HTML, Statuses: map[int]string{200: "page"}, Handle: docsui.Handler(func() string { return docsui.Swagger("LMCache MP Coordinator", "/openapi.json") })},
		{Method: "GET", Path: "/redoc", Summary: "ReDoc", Hidden: true, Produces: httproute.HTML, Statuses: map[int]string{200: "page"}, Handle: docsui.Handler(func() string { return docsui.Redoc("LMCache MP Coordinator", "/openapi.json") })},
		// The operator console (internal/webui): static, so open; the data
		// it fetches goes through the routes above with the token.
		{Method: "GET", Path: "/ui", Summary: "Web console", Hidden: true, Produces: httproute.HTML, Statuses: map[int]string{200: "page"}, Handle: ui.Serve},
		{Method: "GET", Path: "/ui/{file}", Summary: "Web console assets", Hidden: true, Statuses: map[int]string{200: "asset", 404: "unknown asset"}, Handle: ui.Serve},
		{Method: "GET", Path: "/ui/api/fleet", Summary: "Web console fleet view (heartbeats, eviction watermarks, prefetches in flight)", Hidden: true,
			Statuses: map[int]string{200: "Fleet view"}, Response: ConsoleFleet{}, Handle: s.consoleFleet(pf)},
	}
	// Go profiling (net/http/pprof), beyond upstream: the route set
	// `lmcache server` shares, always behind the token, and without one
	// served to loopback clients only.
	rts = append(rts, httproute.Pprof{Tag: "observability", Token: s.cfg.AuthToken, Forbidden: ErrForbidden, TokenFlag: "--auth-token",
		Scrub: s.scrubText}.Routes()...)
	for i := range rts {
		// The prefetch poll is a GET, but it is relayed with the MP
		// servers' token, so leaving it open would let anyone around the
		// servers' own authentication. GET /config is a token read as on
		// `lmcache server`: it names endpoints, files and which layer set
		// the tokens. The pprof routes arrive Bearer already.
		if rts[i].Method != http.MethodGet || strings.HasPrefix(rts[i].Path, "/cache/prefetches/") || rts[i].Path == "/config" {
			rts[i].Auth = httproute.Bearer
			rts[i].Statuses[401] = "Bearer token missing or wrong (only with --auth-token)"
		}
		// Every route that reads a JSON body bounds the time the client
		// has to send it (readInto); pprof's symbol lookup reads its own.
		if rts[i].Request != nil && rts[i].RequestType == "" {
			rts[i].Statuses[408] = "Request body not received within the read deadline"
		}
	}
	if s.kafka != nil {
		// Kafka is the event source: POST /events is not mounted (404, as
		// upstream), since one door per emitter stream is what the gate's
		// seq cursor assumes. POST /quota/events, which the gate only
		// observes, stays.
		rts = slices.DeleteFunc(rts, func(r route) bool { return r.Path == "/events" })
	}
	return s.haRoutes(rts)
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
	rts := s.table.Routes()
	out := make([]RouteInfo, len(rts))
	for i, rt := range rts {
		out[i] = RouteInfo{rt.Method, rt.Path, rt.Hidden, rt.Auth == httproute.Bearer}
	}
	return out
}

// buildTable builds the served and documented table.
func (s *Server) buildTable() (*httproute.Table, error) {
	return httproute.New(httproute.Config{
		Title: "LMCache MP Coordinator", Version: "1.0.0",
		Token:   s.cfg.AuthToken,
		Errors:  apiErrors,
		OnError: s.onError,
	}, s.routeTable())
}

// onError is the one scrub of every handler error before it becomes a
// body: an error's text can carry an MP server's reply or a transport
// error (the prefetch relay's 502s) or request-derived text, any of which
// may hold a configured token. The message the body shows (the outermost
// httproute.Error's, as apiErrors writes it) is scrubbed; the status is
// still decided by the wrapped error. A 422's detail list is written from
// the validation error itself, unchanged: it echoes only the client's own
// input. Bodies a handler writes itself (the prefetch status relay's 200s
// and relayed statuses) are scrubbed where they are written.
func (s *Server) onError(_ *http.Request, _ *httproute.Route, _ int, err error) error {
	msg := httproute.Message(err)
	if clean := s.scrubText(msg); clean != msg {
		return &httproute.Error{Kind: err, Msg: clean}
	}
	return err
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) error {
	return s.table.ServeOpenAPI(w, r)
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) error {
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}
