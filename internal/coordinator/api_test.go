package coordinator_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestOpenAPICoversEveryRoute: every served route appears in
// /openapi.json, and every route in the table is really served (neither
// the 404 nor the 405 fallback answers it).
func TestOpenAPICoversEveryRoute(t *testing.T) {
	c := startCoord(t, nil)
	code, raw := c.do("GET", "/openapi.json", nil)
	if code != 200 {
		t.Fatalf("openapi %d", code)
	}
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	routes := c.srv.Routes()
	if len(routes) != 34 {
		t.Fatalf("route table has %d routes", len(routes))
	}
	n, public := 0, 0
	for _, rt := range routes {
		_, inDoc := doc.Paths[rt.Path][strings.ToLower(rt.Method)]
		if rt.Hidden {
			if inDoc {
				t.Errorf("hidden %s %s is in openapi.json", rt.Method, rt.Path)
			}
		} else {
			public++
			if !inDoc {
				t.Errorf("%s %s missing from openapi.json", rt.Method, rt.Path)
			}
		}
		path := strings.NewReplacer("{instance_id}", "x", "{request_id}", "y", "{cache_salt}", "z", "{thread_name}", "coordinator-eviction", "{file}", "console.js").Replace(rt.Path)
		code, raw := c.do(rt.Method, path+pprofQuery(rt.Path), nil)
		if (code == 404 && string(raw) == `{"detail":"Not Found"}`) || code == 405 {
			t.Errorf("%s %s not served: %d %s", rt.Method, rt.Path, code, raw)
		}
	}
	for _, ops := range doc.Paths {
		n += len(ops)
	}
	if n != public || public != 29 {
		t.Fatalf("openapi has %d operations, table %d public routes", n, public)
	}
	for _, p := range []string{"/docs", "/redoc"} {
		if code, raw := c.do("GET", p, nil); code != 200 || !strings.Contains(string(raw), "/openapi.json") {
			t.Fatalf("%s = %d", p, code)
		}
	}
}

// TestUndocumentedCacheDeleteNotServed: upstream's coordinator code has a
// POST /cache/delete its API reference does not document; it is not
// served here (the compatibility row says "missing"), so it is the plain
// 404 of any unknown path, with or without a body.
func TestUndocumentedCacheDeleteNotServed(t *testing.T) {
	c := startCoord(t, nil)
	for _, body := range []any{nil, map[string]any{"keys": []string{"k"}}} {
		if code, raw := c.do("POST", "/cache/delete", body); code != 404 || string(raw) != `{"detail":"Not Found"}` {
			t.Fatalf("POST /cache/delete (body %v) = %d %s, want 404 {\"detail\":\"Not Found\"}", body, code, raw)
		}
	}
}

func TestUnknownRouteMethodAndBodyLimit(t *testing.T) {
	c := startCoord(t, nil)
	if code, raw := c.do("GET", "/nope", nil); code != 404 || string(raw) != `{"detail":"Not Found"}` {
		t.Fatalf("404 = %d %s", code, raw)
	}
	if code, raw := c.do("PATCH", "/instances", nil); code != 405 || string(raw) != `{"detail":"Method Not Allowed"}` {
		t.Fatalf("405 = %d %s", code, raw)
	}
	patch, err := http.NewRequest("PATCH", c.base+"/instances", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.client.Do(patch)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if allow := resp.Header.Get("Allow"); allow != "GET, POST" {
		t.Fatalf("405 Allow = %q, want GET, POST", allow)
	}
	if code, _ := c.do("POST", "/quota/config", map[string]any{}); code != 405 {
		t.Fatalf("POST /quota/config = %d", code)
	}
	// Path parameters are single segments.
	if code, _ := c.do("PUT", "/instances/a/b/heartbeat", nil); code != 404 {
		t.Fatalf("multi-segment id = %d", code)
	}
	big := `{"ip":"h","http_port":1,"metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`
	if code, _ := c.do("POST", "/instances", big); code != 413 {
		t.Fatalf("oversized body = %d", code)
	}
	// A non-JSON content type is not parsed (FastAPI): 422.
	req := `{"ip":"h","http_port":1}`
	r, err := c.client.Post(c.base+"/instances", "text/plain", strings.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 422 {
		t.Fatalf("text/plain = %d", r.StatusCode)
	}
}

func TestMetricsExposition(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.MetricsTopSalts = 2 })
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.events(ev("store", "01", "a", 100), ev("store", "02", "b", 300), ev("store", "03", "c", 200), ev("lookup", "01", "a", 0), ev("delete", "02", "b", 0))
	c.must("PUT", "/quota/c", map[string]any{"limit_gb": 0}, 200)
	c.cycle()
	c.must("POST", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}}, 200)
	_, raw := c.do("GET", "/metrics", nil)
	text := string(raw)
	for _, want := range []string{
		"lmcache_coordinator_registered_instances 1",
		`lmcache_coordinator_events_ingested_total{type="store"} 3`,
		`lmcache_coordinator_events_ingested_total{type="lookup"} 1`,
		`lmcache_coordinator_events_ingested_total{type="delete"} 1`,
		"lmcache_coordinator_event_batches_total 1",
		"lmcache_coordinator_tracked_keys 2",
		"lmcache_coordinator_tracked_bytes 300",
		"lmcache_coordinator_eviction_cycles_total 1",
		"lmcache_coordinator_eviction_keys_dispatched_total 1",
		"lmcache_coordinator_eviction_dispatch_failures_total 0",
		"lmcache_coordinator_resync_pages_total 0",
		"lmcache_coordinator_resync_keys_total 0",
		"lmcache_coordinator_active_pins 1",
		`lmcache_coordinator_salt_usage_bytes{cache_salt="c"} 200`,
		`lmcache_coordinator_salt_usage_bytes{cache_salt="a"} 100`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("missing %q", want)
		}
	}
	// Per-salt series are bounded: 3 salts ever seen, 2 exported.
	if n := strings.Count(text, "lmcache_coordinator_salt_usage_bytes{"); n != 2 {
		t.Errorf("%d per-salt series, want 2", n)
	}
}

// TestStateFileRoundTrip: quotas, the default limit and pins are written
// atomically on change and read back by the next coordinator.
func TestStateFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	withState := func(cfg *config.Config) { cfg.StateFile = path }
	pin := map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "cache_salt": "alice"}
	func() {
		c := startCoord(t, withState)
		c.must("PUT", "/quota/a", map[string]any{"limit_gb": 2.0}, 200)
		c.must("PUT", "/quota/_default", map[string]any{"limit_gb": 1.0}, 200)
		c.must("PUT", "/quota/config", map[string]any{"default_limit_gb": 0}, 200)
		c.must("POST", "/cache/pins", pin, 200)
		c.must("POST", "/cache/pins", pin, 200)
		c.must("DELETE", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}, "cache_salt": "alice"}, 200)
	}()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatalf("state file not JSON: %v", err)
	}
	c := startCoord(t, withState)
	if g := c.must("GET", "/quota/a", nil, 200); g["quota_exists"] != true || g["quota_limit_gb"] != 2.0 {
		t.Fatalf("quota a = %v", g)
	}
	if g := c.must("GET", "/quota/_default", nil, 200); g["quota_exists"] != true {
		t.Fatalf("empty salt quota lost: %v", g)
	}
	if _, raw := c.do("GET", "/quota/config", nil); string(raw) != `{"default_limit_gb":0.0}` {
		t.Fatalf("default = %s", raw)
	}
	// Chunk 0 was pinned twice and unpinned once, chunk 1 pinned twice: both
	// still protected after the restart; one more unpin frees only chunk 0.
	const h0 = "6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368b71123c"
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.events(rev("store", h0, "alice", 10))
	c.must("DELETE", "/cache/pins", map[string]any{"model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}, "cache_salt": "alice"}, 200)
	c.cycle()
	if b := mp.deleteBatches(); len(b) != 1 || b[0][0].ChunkHashHex != h0 {
		t.Fatalf("pin counts not restored: %v", b)
	}
	// Without the flag nothing is persisted.
	c2 := startCoord(t, nil)
	if g := c2.must("GET", "/quota/a", nil, 200); g["quota_exists"] != false {
		t.Fatalf("memory-only coordinator saw state: %v", g)
	}
}

// TestStateFileCorruptMovedAside: an unparsable --state-file does not stop
// the coordinator: the file is renamed to <file>.corrupt-<timestamp> with
// its bytes intact, an ERROR line names both paths, the coordinator starts
// with empty quotas, and /healthz and the state_file_corrupt gauge say so.
// The next change writes a fresh, valid file at the original path.
func TestStateFileCorruptMovedAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCoord(t, func(cfg *config.Config) { cfg.StateFile = path })
	aside, err := filepath.Glob(path + ".corrupt-*")
	if err != nil || len(aside) != 1 {
		t.Fatalf("moved-aside files %v (%v)", aside, err)
	}
	if b, err := os.ReadFile(aside[0]); err != nil || string(b) != "{not json" {
		t.Fatalf("moved-aside content %q (%v)", b, err)
	}
	if !c.logs.Has("level=ERROR") || !c.logs.Has("state file is corrupt") || !c.logs.Has(aside[0]) {
		t.Fatalf("no ERROR line naming %s:\n%s", aside[0], c.logs.String())
	}
	if _, raw := c.do("GET", "/healthz", nil); string(raw) != `{"state_file_corrupt":true,"status":"healthy"}` {
		t.Fatalf("healthz = %s", raw)
	}
	if _, raw := c.do("GET", "/metrics", nil); !strings.Contains(string(raw), "lmcache_coordinator_state_file_corrupt 1\n") {
		t.Fatal("state_file_corrupt gauge is not 1")
	}
	if g := c.must("GET", "/quota", nil, 200); len(g["by_cache_salt"].([]any)) != 0 {
		t.Fatalf("not empty: %v", g)
	}
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 1}, 200)
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), `"a": 1073741824`) {
		t.Fatalf("fresh state file %s (%v)", b, err)
	}
	// A coordinator with a healthy state file reports false.
	c2 := startCoord(t, func(cfg *config.Config) { cfg.StateFile = path })
	if _, raw := c2.do("GET", "/healthz", nil); string(raw) != `{"state_file_corrupt":false,"status":"healthy"}` {
		t.Fatalf("healthz after a good load = %s", raw)
	}
}

// TestStateFileUnreadableFailsStartup: a file that exists but cannot be
// read is not "corrupt" (nothing is moved aside); startup fails.
func TestStateFileUnreadableFailsStartup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.Mkdir(path, 0o700); err != nil { // a directory: read fails with EISDIR
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.StateFile = path
	if _, err := newServer(cfg); err == nil || !strings.Contains(err.Error(), "state.json") {
		t.Fatalf("unreadable state file: %v", err)
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 0 {
		t.Fatalf("unreadable file moved aside: %v", m)
	}
}

func TestStateFileUnwritableFailsStartup(t *testing.T) {
	cfg := testConfig()
	cfg.StateFile = filepath.Join(t.TempDir(), "missing-dir", "state.json")
	if _, err := newServer(cfg); err == nil {
		t.Fatal("unwritable state file accepted")
	}
}

func TestFloatsMarshalLikePython(t *testing.T) {
	c := startCoord(t, nil)
	if _, raw := c.do("PUT", "/quota/a", map[string]any{"limit_gb": 10}); string(raw) != `{"cache_salt":"a","limit_gb":10.0,"status":"ok"}` {
		t.Fatalf("put = %s", raw)
	}
	c.events(ev("store", "01", "a", 1))
	if _, raw := c.do("GET", "/quota/a", nil); string(raw) != `{"cache_salt":"a","quota_limit_gb":10.0,"quota_exists":true,"usage_gb":9.313225746154785e-10}` {
		t.Fatalf("get = %s", raw)
	}
}

// TestKeepAliveIdleTimeoutClosesConnection: --timeout-keep-alive is the
// server's idle timeout, on a real socket. A request sent straight after a
// response reuses the connection (it is not closed at once), and with the
// flag at 1 s the idle connection is then closed by the server (EOF)
// within a 5 s read deadline: well above the configured second, and below
// the 10 s default, so a server ignoring the flag fails with a timeout.
// TestKeepAliveIdleTimeoutIsConfigured pins the closing time exactly.
func TestKeepAliveIdleTimeoutClosesConnection(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) { cfg.TimeoutKeepAlive = 1 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := 0; i < 2; i++ {
		if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the kept-alive connection: %v", i+1, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("request %d: status %d close %v", i+1, resp.StatusCode, resp.Close)
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection not closed by the server: %v", err)
	}
}
