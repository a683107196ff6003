package httpapi_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// routePath fills a route's path parameters (and the query some routes
// need to be guarded or to finish quickly).
func routePath(r httpapi.RouteInfo) string {
	p := strings.NewReplacer("{request_id}", "x", "{cache_salt}", "alice", "{backend}", "dax", "{operation}", "add", "{thread_name}", "x").Replace(r.Path)
	switch r.Path {
	case "/loglevel":
		p += "?logger_name=x&level=DEBUG"
	case "/debug/pprof/profile", "/debug/pprof/trace":
		p += "?seconds=1"
	}
	return p
}

// TestAuthEveryRoute walks the route table (so a new route cannot be
// forgotten) × (no token, wrong token, right token). Guarded routes answer
// 401 in their own error shape with WWW-Authenticate without the right
// token and never 401 with it; open routes never answer 401.
func TestAuthEveryRoute(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.AuthToken = "s3cret-token"; o.RunScriptEnabled = true }})
	anon := map[string]string{"Authorization": ""}
	wrong := map[string]string{"Authorization": "Bearer s3cret-tokeX"}
	notBearer := map[string]string{"Authorization": "Basic s3cret-token"}
	var open []string
	guarded := 0
	for _, r := range httpapi.Routes() {
		path := routePath(r)
		if r.Auth == "never" || r.Auth == "opt-in" {
			open = append(open, r.Method+" "+r.Path)
			if res := e.do(r.Method, path, "{}", anon); res.code == http.StatusUnauthorized {
				t.Errorf("%s %s is open but answered 401", r.Method, path)
			}
			continue
		}
		guarded++
		if !contains(r.Statuses, 401) {
			t.Errorf("%s %s is guarded but does not document 401", r.Method, r.Path)
		}
		for _, h := range []map[string]string{anon, wrong, notBearer} {
			res := e.do(r.Method, path, "{}", h)
			if res.code != http.StatusUnauthorized || res.header.Get("WWW-Authenticate") != `Bearer realm="lmcache"` {
				t.Errorf("%s %s with %v: %d %s", r.Method, path, h, res.code, res.body)
				continue
			}
			checkShape(t, r, res.body)
		}
		if res := e.do(r.Method, path, "{}", nil); res.code == http.StatusUnauthorized {
			t.Errorf("%s %s with the right token: 401 %s", r.Method, path, res.body)
		}
	}
	sort.Strings(open)
	wantOpen := []string{"GET /", "GET /commit_id", "GET /healthcheck", "GET /lmc_version", "GET /metrics", "GET /openapi.json",
		"GET /periodic-threads", "GET /periodic-threads-health", "GET /periodic-threads/{thread_name}", "GET /ui", "GET /ui/{file}", "GET /version"}
	if strings.Join(open, ",") != strings.Join(wantOpen, ",") {
		t.Errorf("open routes = %q, want %q", open, wantOpen)
	}
	if guarded != len(httpapi.Routes())-len(wantOpen) {
		t.Errorf("%d guarded routes", guarded)
	}
	// Reading one logger's level stays open; setting it needs the token.
	e.expect(200, "GET", "/loglevel?logger_name=x", nil, anon)
	e.expect(200, "GET", "/loglevel?logger_name=x&level=DEBUG", nil)
	// Unknown pprof profiles are pprof's 404.
	e.expect(404, "GET", "/debug/pprof/nope", nil)
}

func checkShape(t *testing.T, r httpapi.RouteInfo, body []byte) {
	t.Helper()
	switch r.ErrorShape {
	case "text":
		if string(body) != "missing or invalid bearer token" {
			t.Errorf("%s %s: 401 text body %q", r.Method, r.Path, body)
		}
	default:
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil || len(m) != 1 || m[r.ErrorShape] != "missing or invalid bearer token" {
			t.Errorf("%s %s: 401 body %s, want {%q: ...}", r.Method, r.Path, body, r.ErrorShape)
		}
	}
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestProtectMetrics: GET /metrics needs the token only when the operator
// opts in.
func TestProtectMetrics(t *testing.T) {
	anon := map[string]string{"Authorization": ""}
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.AuthToken = "tok-1234"; o.ProtectMetrics = true }})
	e.expect(401, "GET", "/metrics", nil, anon)
	if r := e.expect(200, "GET", "/metrics", nil); !strings.Contains(string(r.body), "# TYPE") {
		t.Fatalf("metrics body %.200s", r.body)
	}
	e = start(t, envOpts{mutate: func(o *httpapi.Options) { o.AuthToken = "tok-1234" }})
	e.expect(200, "GET", "/metrics", nil, anon)
}

// TestPprofWithoutToken: with no token configured pprof is served to
// loopback clients only; others get 403.
func TestPprofWithoutToken(t *testing.T) {
	e := start(t, envOpts{})
	if r := e.expect(200, "GET", "/debug/pprof/", nil); !strings.Contains(string(r.body), "goroutine") {
		t.Fatalf("pprof index %.200s", r.body)
	}
	for _, r := range httpapi.Routes() {
		if !strings.HasPrefix(r.Path, "/debug/pprof/") {
			continue
		}
		for _, remote := range []string{"10.1.2.3:4567", "[2001:db8::1]:80"} {
			req := httptest.NewRequest(r.Method, routePath(r), nil)
			req.RemoteAddr = remote
			rec := httptest.NewRecorder()
			e.srv.Handler().ServeHTTP(rec, req)
			record(req, rec.Code)
			if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "loopback") {
				t.Fatalf("%s %s from %s: %d %s", r.Method, r.Path, remote, rec.Code, rec.Body)
			}
		}
	}
}

// TestPprofCmdlineRedacted: the command line pprof serves hides secret
// flag values.
func TestPprofCmdlineRedacted(t *testing.T) {
	saved := os.Args
	os.Args = []string{"lmcache", "server", "--http-auth-token", "cmdline-tok-9", "--l2-adapter", `{"type":"s3","aws_secret_access_key":"cmdline-key-9"}`}
	t.Cleanup(func() { os.Args = saved })
	e := start(t, envOpts{})
	body := string(e.expect(200, "GET", "/debug/pprof/cmdline", nil).body)
	if strings.Contains(body, "cmdline-tok-9") || strings.Contains(body, "cmdline-key-9") || !strings.Contains(body, "--http-auth-token\x00"+httpapi.Redacted) {
		t.Fatalf("cmdline = %q", body)
	}
}

// TestSecurityDocMatchesRoutes: docs/security.md lists every route served
// (the hidden docs pages too) with the protection the route table gives
// it, and nothing else.
func TestSecurityDocMatchesRoutes(t *testing.T) {
	f, err := os.Open("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([A-Z]+) ([^`]+)` \\| ([^|]+) \\|")
	doc := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			doc[m[1]+" "+m[2]] = strings.TrimSpace(m[3])
		}
	}
	for _, r := range httpapi.ServedRoutes() {
		k := r.Method + " " + r.Path
		got, ok := doc[k]
		if !ok {
			t.Errorf("docs/security.md has no row for %s", k)
			continue
		}
		if got != r.Auth {
			t.Errorf("docs/security.md: %s is %q, route table says %q", k, got, r.Auth)
		}
		delete(doc, k)
	}
	for k := range doc {
		t.Errorf("docs/security.md lists %s, which is not a route", k)
	}
}
