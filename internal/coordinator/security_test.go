package coordinator_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/registry"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/redact"
)

const (
	coordToken = "coord-s3cret-token"
	mpToken    = "mp-s3cret-token"
)

// routePath fills a route's path parameters with values every handler
// accepts (and shortens the pprof profile and trace to a second).
func routePath(p string) string {
	return strings.NewReplacer("{instance_id}", "x", "{request_id}", "y", "{cache_salt}", "z", "{thread_name}", "nope").Replace(p) + pprofQuery(p)
}

// TestRouteAuthTable walks the whole route table: with --auth-token set,
// every protected route answers 401 (FastAPI {"detail": ...}, a Bearer
// challenge) to a missing or wrong token and, with the right token, the
// same status as a coordinator without --auth-token; every open route
// answers all three like the unauthenticated coordinator. The token never
// appears in a response or a log line.
func TestRouteAuthTable(t *testing.T) {
	secured := startCoord(t, func(c *config.Config) { c.AuthToken = coordToken })
	plain := startCoord(t, nil)
	routes := secured.srv.Routes()
	if len(routes) != 34 {
		t.Fatalf("route table has %d routes", len(routes))
	}
	protected := 0
	for _, rt := range routes {
		path := routePath(rt.Path)
		if rt.Auth != (rt.Method != "GET" || strings.HasPrefix(rt.Path, "/cache/prefetches/") || rt.Path == "/config" || strings.HasPrefix(rt.Path, "/debug/pprof/")) {
			t.Errorf("%s %s: Auth=%v; every non-GET route, the prefetch relay, GET /config and pprof must be protected, and only those", rt.Method, rt.Path, rt.Auth)
		}
		// The same empty JSON object body for every case, so the only
		// difference between the requests is the header.
		want, _, _ := plain.doAuth(rt.Method, path, "{}", "")
		if want == 401 {
			t.Fatalf("%s %s: 401 without --auth-token", rt.Method, rt.Path)
		}
		for _, tc := range []struct{ name, header string }{
			{"no token", ""},
			{"wrong token", "Bearer " + coordToken + "x"},
			{"basic scheme", "Basic " + coordToken},
			{"right token", "Bearer " + coordToken},
		} {
			code, hdr, raw := secured.doAuth(rt.Method, path, "{}", tc.header)
			if strings.Contains(string(raw), coordToken) || strings.Contains(strings.Join(hdr.Values("WWW-Authenticate"), ","), coordToken) {
				t.Errorf("%s %s %s: response echoes the token", rt.Method, rt.Path, tc.name)
			}
			if rt.Auth && tc.name != "right token" {
				if code != 401 || string(raw) != `{"detail":"missing or invalid bearer token"}` || hdr.Get("WWW-Authenticate") != `Bearer realm="lmcache-coordinator"` {
					t.Errorf("%s %s %s: %d %s (challenge %q), want 401", rt.Method, rt.Path, tc.name, code, raw, hdr.Get("WWW-Authenticate"))
				}
				continue
			}
			if code != want {
				t.Errorf("%s %s %s: %d %s, want %d as without --auth-token", rt.Method, rt.Path, tc.name, code, raw, want)
			}
		}
		if rt.Auth {
			protected++
		}
	}
	if protected != 19 {
		t.Fatalf("%d protected routes, want 19", protected)
	}
	if strings.Contains(secured.logs.String(), coordToken) {
		t.Fatal("a log line contains the auth token")
	}
}

// TestUnauthorizedChangesNothing: a rejected request has no effect: no
// quota set, no event recorded, no instance registered or deleted, no pin.
func TestUnauthorizedChangesNothing(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.AuthToken = coordToken })
	bad := "Bearer nope"
	c.must("POST", "/instances", map[string]any{"instance_id": "keep", "ip": "127.0.0.1", "http_port": 1}, 200)
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"PUT", "/quota/a", map[string]any{"limit_gb": 1}},
		{"PUT", "/quota/config", map[string]any{"default_limit_gb": 0}},
		{"POST", "/quota/events", map[string]any{"instance_id": "i", "seq": 1, "events": []any{ev("store", "0a", "a", 100)}}},
		{"POST", "/instances", map[string]any{"instance_id": "evil", "ip": "127.0.0.1", "http_port": 2}},
		{"DELETE", "/instances/keep", nil},
		{"POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}}},
	} {
		if code, _, raw := c.doAuth(r.method, r.path, r.body, bad); code != 401 {
			t.Fatalf("%s %s: %d %s", r.method, r.path, code, raw)
		}
	}
	if g := c.must("GET", "/quota/a", nil, 200); g["quota_exists"] != false || g["usage_gb"] != 0.0 {
		t.Fatalf("quota a = %v", g)
	}
	if _, raw := c.do("GET", "/quota/config", nil); string(raw) != `{"default_limit_gb":null}` {
		t.Fatalf("default = %s", raw)
	}
	l := c.must("GET", "/instances", nil, 200)["instances"].([]any)
	if len(l) != 1 || l[0].(map[string]any)["instance_id"] != "keep" {
		t.Fatalf("instances = %v", l)
	}
	if _, raw := c.do("GET", "/metrics", nil); !strings.Contains(string(raw), "lmcache_coordinator_active_pins 0\n") ||
		!strings.Contains(string(raw), "lmcache_coordinator_event_batches_total 0\n") {
		t.Fatal("a rejected pin or event batch was applied")
	}
}

// TestMPAuthTokenSentOnEveryMPCall: with --mp-auth-token the eviction
// DELETE, the resync listing and both prefetch relays carry
// "Authorization: Bearer <token>"; without it they carry none.
func TestMPAuthTokenSentOnEveryMPCall(t *testing.T) {
	for _, tc := range []struct{ token, want string }{{mpToken, "Bearer " + mpToken}, {"", ""}} {
		mp := newMP(t)
		mp.pages = []mpPage{{entries: []any{map[string]any{"key": ekey("0c", "a"), "size_bytes": 5}}}}
		c := startCoord(t, func(cfg *config.Config) { cfg.MPAuthToken = tc.token })
		mp.register(c, "mp-1")
		c.events(ev("store", "0a", "a", 100))
		c.must("PUT", "/quota/a", map[string]any{"limit_gb": 0}, 200)
		c.cycle()
		c.must("POST", "/cache/prefetches", map[string]any{"instance_id": "mp-1", "model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}}, 200)
		c.must("GET", "/cache/prefetches/mp-1/abc", nil, 200)
		h, p := mp.hostPort()
		if n := c.srv.ResyncFrom(context.Background(), registryInstance(h, p)); n != 1 {
			t.Fatalf("resync recorded %d keys", n)
		}
		got := mp.authHeaders()
		if len(got) != 4 {
			t.Fatalf("MP saw %d requests, want 4 (delete, submit, poll, list)", len(got))
		}
		for i, a := range got {
			if a != tc.want {
				t.Fatalf("request %d Authorization %q, want %q", i, a, tc.want)
			}
		}
		if tc.token != "" && strings.Contains(c.logs.String(), tc.token) {
			t.Fatal("a log line contains the MP token")
		}
	}
}

// addrListener reports a chosen address while accepting on a real loopback
// listener, so the startup warning's non-loopback branch can be exercised
// without binding a public interface.
type addrListener struct {
	net.Listener
	addr net.Addr
}

func (l addrListener) Addr() net.Addr { return l.addr }

// TestNoAuthWarnsOffLoopback: without --auth-token, a listener that is not
// on loopback logs one warning; a loopback one, or any listener with a
// token, logs none.
func TestNoAuthWarnsOffLoopback(t *testing.T) {
	const warning = "no --auth-token set and the listener is not on loopback"
	for _, tc := range []struct {
		name   string
		token  string
		public bool
		warn   bool
	}{{"public, no token", "", true, true}, {"loopback, no token", "", false, false}, {"public, token", coordToken, true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.AuthToken = tc.token
			logs := &logtest.Buffer{}
			srv, err := coordinator.New(cfg, coordinator.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var ln net.Listener = raw
			if tc.public {
				ln = addrListener{raw, &net.TCPAddr{IP: net.IPv4zero, Port: raw.Addr().(*net.TCPAddr).Port}}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx, ln) }()
			waitFor(t, "listening line", func() bool { return logs.Has("MP coordinator listening") })
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := strings.Count(logs.String(), warning); got != map[bool]int{true: 1, false: 0}[tc.warn] {
				t.Fatalf("%d warnings:\n%s", got, logs.String())
			}
			if tc.token != "" && strings.Contains(logs.String(), tc.token) {
				t.Fatal("log contains the token")
			}
		})
	}
}

// TestRouteProtectionDocMatchesTable: the "Route protection" table in
// docs/compatibility.md lists exactly the served routes, each marked as the
// route table protects it.
func TestRouteProtectionDocMatchesTable(t *testing.T) {
	f, err := os.Open("../../docs/compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(GET|POST|PUT|DELETE) ([^`]+)` \\| (token|open) \\|")
	doc := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			in = strings.Contains(line, "Route protection")
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			doc[m[1]+" "+m[2]] = m[3]
		}
	}
	if err := sc.Err(); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	srv, err := newServer(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, rt := range srv.Routes() {
		mode := "open"
		if rt.Auth {
			mode = "token"
		}
		want[rt.Method+" "+rt.Path] = mode
	}
	var diff []string
	for k, v := range want {
		if doc[k] != v {
			diff = append(diff, k+": table "+v+", doc "+doc[k])
		}
	}
	for k := range doc {
		if _, ok := want[k]; !ok {
			diff = append(diff, k+": in the doc, not served")
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Fatalf("docs/compatibility.md Route protection differs from the route table:\n%s", strings.Join(diff, "\n"))
	}
}

func registryInstance(ip string, port int) registry.Instance {
	return registry.Instance{InstanceID: "mp-1", IP: ip, HTTPPort: port}
}

// TestEchoedTokenIsScrubbed: an MP server that echoes the coordinator's MP
// token in an error reply does not get it into the coordinator's 502 body
// or its logs.
func TestEchoedTokenIsScrubbed(t *testing.T) {
	mp := newMP(t)
	mp.submitCode = 500
	mp.submitBody = `{"detail":"bad header Bearer ` + mpToken + `"}`
	c := startCoord(t, func(cfg *config.Config) { cfg.MPAuthToken = mpToken })
	mp.register(c, "mp-1")
	code, raw := c.do("POST", "/cache/prefetches", map[string]any{"instance_id": "mp-1", "model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}})
	if code != 502 || strings.Contains(string(raw), mpToken) || !strings.Contains(string(raw), "bad header Bearer ***") {
		t.Fatalf("502 body: %d %s", code, raw)
	}
	if !c.logs.Has("prefetch submit failed") || strings.Contains(c.logs.String(), mpToken) {
		t.Fatalf("log:\n%s", c.logs.String())
	}
	// The status poll relays the server's body verbatim, JSON or not, but
	// for the token.
	for _, body := range []string{`{"status":"pending","note":"Bearer ` + mpToken + `"}`, `bad header Bearer ` + mpToken} {
		mp.statusCode, mp.statusBody = 200, body
		code, raw = c.do("GET", "/cache/prefetches/mp-1/abc", nil)
		if want := strings.ReplaceAll(body, mpToken, redact.Marker); code != 200 || strings.Contains(string(raw), mpToken) || !strings.Contains(string(raw), strings.Trim(want, "{}")) {
			t.Fatalf("relayed status %q: %d %s", body, code, raw)
		}
	}
}

// TestHeaderBlockBounded: the coordinator's server comes from httplimit, so
// a header block over 128 KiB is refused with 431 before any handler runs.
func TestHeaderBlockBounded(t *testing.T) {
	c := startCoord(t, nil)
	req, err := http.NewRequest("GET", c.base+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("a", 200<<10))
	resp, err := c.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
}
