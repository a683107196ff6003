package coordinator_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/redact"
)

// pprofQuery is the query a route walk adds so the pprof CPU profile and
// trace finish in a second (the profile's default is 30 s).
func pprofQuery(path string) string {
	if path == "/debug/pprof/profile" || path == "/debug/pprof/trace" {
		return "?seconds=1"
	}
	return ""
}

// pprofRoutes is the pprof part of the coordinator's route table.
func pprofRoutes(t *testing.T, srv *coordinator.Server) []coordinator.RouteInfo {
	t.Helper()
	var out []coordinator.RouteInfo
	for _, rt := range srv.Routes() {
		if strings.HasPrefix(rt.Path, "/debug/pprof/") {
			out = append(out, rt)
		}
	}
	want := "GET /debug/pprof/,GET /debug/pprof/cmdline,GET /debug/pprof/profile,GET /debug/pprof/symbol,POST /debug/pprof/symbol,GET /debug/pprof/trace"
	var got []string
	for _, rt := range out {
		got = append(got, rt.Method+" "+rt.Path)
	}
	if strings.Join(got, ",") != want {
		t.Fatalf("pprof routes %q, want %s", got, want)
	}
	return out
}

// TestPprofAuth: with --auth-token every pprof route (and a named profile
// under the index) answers 401 {"detail": ...} with the Bearer challenge
// without the token, and 200 with it; with the token a non-loopback client
// is served too (the token, not the address, is the rule then).
func TestPprofAuth(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.AuthToken = coordToken })
	paths := map[string]string{}
	for _, rt := range pprofRoutes(t, c.srv) {
		if !rt.Auth || rt.Hidden {
			t.Errorf("%s %s: Auth=%v Hidden=%v, want a protected, documented route", rt.Method, rt.Path, rt.Auth, rt.Hidden)
		}
		paths[rt.Method+" "+rt.Path+pprofQuery(rt.Path)] = rt.Method
	}
	paths["GET /debug/pprof/goroutine?debug=1"] = "GET"
	for key, method := range paths {
		path := strings.TrimPrefix(key, method+" ")
		code, hdr, raw := c.doAuth(method, path, nil, "")
		if code != 401 || string(raw) != `{"detail":"missing or invalid bearer token"}` || hdr.Get("WWW-Authenticate") != `Bearer realm="lmcache-coordinator"` {
			t.Errorf("%s without the token: %d %s (challenge %q)", key, code, raw, hdr.Get("WWW-Authenticate"))
		}
		if code, _, raw := c.doAuth(method, path, nil, "Bearer "+coordToken); code != 200 || len(raw) == 0 {
			t.Errorf("%s with the token: %d, %d bytes", key, code, len(raw))
		}
	}
	code, _, raw := c.doAuth("GET", "/debug/pprof/goroutine?debug=1", nil, "Bearer "+coordToken)
	if code != 200 || !strings.Contains(string(raw), "goroutine profile:") {
		t.Fatalf("goroutine profile: %d %.200s", code, raw)
	}
	req := httptest.NewRequest("GET", "/debug/pprof/", nil)
	req.RemoteAddr = "10.0.0.1:1234"
	req.Header.Set("Authorization", "Bearer "+coordToken)
	rec := httptest.NewRecorder()
	c.srv.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "goroutine") {
		t.Fatalf("non-loopback client with the token: %d %.200s", rec.Code, rec.Body)
	}
}

// TestPprofWithoutToken: with no --auth-token, a loopback client gets the
// index (which lists the goroutine profile) and a non-loopback one (IPv4
// or IPv6) gets 403 {"detail": ...} naming the loopback rule on every
// pprof route, in the coordinator's FastAPI error shape.
func TestPprofWithoutToken(t *testing.T) {
	c := startCoord(t, nil)
	code, raw := c.do("GET", "/debug/pprof/", nil)
	if code != 200 || !strings.Contains(string(raw), "goroutine") {
		t.Fatalf("pprof index from loopback: %d %.200s", code, raw)
	}
	for _, rt := range pprofRoutes(t, c.srv) {
		for _, remote := range []string{"10.0.0.1:1234", "[2001:db8::1]:80"} {
			req := httptest.NewRequest(rt.Method, rt.Path+pprofQuery(rt.Path), nil)
			req.RemoteAddr = remote
			rec := httptest.NewRecorder()
			c.srv.Handler().ServeHTTP(rec, req)
			if rec.Code != http.StatusForbidden || rec.Body.String() != `{"detail":"pprof is served to loopback clients only unless --auth-token is set"}` {
				t.Errorf("%s %s from %s: %d %s", rt.Method, rt.Path, remote, rec.Code, rec.Body)
			}
		}
	}
}

// TestPprofCmdlineRedacted: /debug/pprof/cmdline hides the values of
// secret-looking flags (both spellings) and, beyond the flag names, the
// configured tokens wherever they appear; other arguments are kept.
func TestPprofCmdlineRedacted(t *testing.T) {
	const tok, mpTok = "cmdline-tok-7", "cmdline-mp-7"
	saved := os.Args
	os.Args = []string{"lmcache", "coordinator", "--auth-token", tok, "--mp-auth-token=" + mpTok, "--label", "x" + mpTok, "--port", "9300"}
	t.Cleanup(func() { os.Args = saved })
	c := startCoord(t, func(cfg *config.Config) { cfg.AuthToken, cfg.MPAuthToken = tok, mpTok })
	code, hdr, raw := c.doAuth("GET", "/debug/pprof/cmdline", nil, c.token)
	want := strings.Join([]string{"lmcache", "coordinator", "--auth-token", redact.Marker, "--mp-auth-token=" + redact.Marker, "--label", "x" + redact.Marker, "--port", "9300"}, "\x00")
	if code != 200 || string(raw) != want || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") || hdr.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("cmdline: %d %q (%s), want %q", code, raw, hdr.Get("Content-Type"), want)
	}
}

// TestPprofOpenAPI: the pprof operations are in /openapi.json with the
// bearer requirement (a token is set), 401 and 403 documented, integer
// seconds on profile and trace, text and binary success bodies, and a
// text request body on POST symbol.
func TestPprofOpenAPI(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.AuthToken = coordToken })
	doc := c.openAPI(t)
	produces := map[string]string{"/debug/pprof/": "text/plain", "/debug/pprof/cmdline": "text/plain", "/debug/pprof/profile": "application/octet-stream",
		"/debug/pprof/symbol": "text/plain", "/debug/pprof/trace": "application/octet-stream"}
	for _, rt := range pprofRoutes(t, c.srv) {
		key := rt.Method + " " + rt.Path
		op := doc.Paths.Value(rt.Path).GetOperation(rt.Method)
		if op == nil {
			t.Fatalf("%s missing", key)
		}
		if op.Security == nil || len(*op.Security) != 1 {
			t.Errorf("%s: no bearer requirement", key)
		}
		for _, s := range []string{"401", "403"} {
			if r := op.Responses.Value(s); r == nil || r.Value.Content.Get("application/json") == nil {
				t.Errorf("%s: %s not documented with a JSON body", key, s)
			}
		}
		if r := op.Responses.Value("200"); r == nil || r.Value.Content.Get(produces[rt.Path]) == nil {
			t.Errorf("%s: 200 not documented as %s", key, produces[rt.Path])
		}
		var seconds *openapi3.Parameter
		for _, p := range op.Parameters {
			if p.Value.In == "query" && p.Value.Name == "seconds" {
				seconds = p.Value
			}
		}
		if wantSeconds := pprofQuery(rt.Path) != ""; wantSeconds != (seconds != nil) {
			t.Errorf("%s: seconds parameter %v, want %v", key, seconds != nil, wantSeconds)
		} else if seconds != nil && !seconds.Schema.Value.Type.Is("integer") {
			t.Errorf("%s: seconds is %v, want integer", key, seconds.Schema.Value.Type)
		}
		if got := op.RequestBody != nil && op.RequestBody.Value.Content.Get("text/plain") != nil; got != (rt.Method == "POST") {
			t.Errorf("%s: text request body %v", key, got)
		}
	}
}
