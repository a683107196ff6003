package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/polltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// coord is a coordinator running on a real loopback listener.
type coord struct {
	t      testing.TB
	srv    *coordinator.Server
	base   string
	client *http.Client
	logs   *logtest.Buffer
	// token is the Authorization header do sends ("Bearer <AuthToken>"
	// when the config has one).
	token string
	// stop cancels Run; wait returns Run's result (once stopped).
	stop func()
	wait func() error
}

// testConfig is the upstream API-test configuration: loops off, chunk 4.
func testConfig() config.Config {
	c := config.Default()
	c.Host = "127.0.0.1"
	c.Port = 0
	c.HealthCheckInterval = 0
	c.EvictionCheckInterval = 0
	c.EnableStartupResync = false
	c.ChunkSize = 4
	return c
}

func startCoord(t testing.TB, mutate func(*config.Config)) *coord {
	t.Helper()
	return startCoordLogging(t, mutate, nil)
}

// startCoordLogging is startCoord whose logger also hands every record to
// also (nil: none); the text log in c.logs is kept either way.
func startCoordLogging(t testing.TB, mutate func(*config.Config), also slog.Handler) *coord {
	t.Helper()
	cfg := testConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	logs := &logtest.Buffer{}
	var h slog.Handler = slog.NewTextHandler(logs, nil)
	if also != nil {
		h = slog.NewMultiHandler(h, also)
	}
	srv, err := coordinator.New(cfg, coordinator.WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	c := runOn(t, srv)
	c.logs = logs
	if cfg.AuthToken != "" {
		c.token = "Bearer " + cfg.AuthToken
	}
	return c
}

// runOn runs srv on a fresh loopback listener until the test ends (or
// stop is called).
func runOn(t testing.TB, srv *coordinator.Server) *coord {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, srv, ln)
}

// serveOn runs srv on ln until the test ends (or stop is called).
func serveOn(t testing.TB, srv *coordinator.Server, ln net.Listener) *coord {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	c := &coord{t: t, srv: srv, base: "http://" + ln.Addr().String(), client: &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second},
		logs: &logtest.Buffer{}, stop: cancel}
	c.wait = sync.OnceValue(func() error { return <-done })
	t.Cleanup(func() {
		cancel()
		if err := c.wait(); err != nil {
			t.Errorf("Run: %v", err)
		}
		c.client.CloseIdleConnections()
	})
	return c
}

// do sends a request; body may be nil, a string (sent raw) or a value
// (JSON-encoded). It returns the status and raw response body.
func (c *coord) do(method, path string, body any) (int, []byte) {
	c.t.Helper()
	code, _, raw := c.doAuth(method, path, body, c.token)
	return code, raw
}

// doAuth is do with an explicit Authorization header ("" for none); it also
// returns the response headers.
func (c *coord) doAuth(method, path string, body any, auth string) (int, http.Header, []byte) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, out
}

// must sends a request, checks the status and decodes the JSON reply.
func (c *coord) must(method, path string, body any, want int) map[string]any {
	c.t.Helper()
	code, raw := c.do(method, path, body)
	if code != want {
		c.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, code, want, raw)
	}
	if len(raw) == 0 {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		c.t.Fatalf("%s %s: body %q is not a JSON object: %v", method, path, raw, err)
	}
	return m
}

func ekey(hash, salt string) map[string]any {
	return map[string]any{"chunk_hash_hex": hash, "model_name": "m", "kv_rank": 0, "cache_salt": salt}
}

func ev(typ, hash, salt string, n int) map[string]any {
	return map[string]any{"type": typ, "key": ekey(hash, salt), "bytes": n}
}

func (c *coord) events(evs ...map[string]any) {
	c.t.Helper()
	c.must("POST", "/quota/events", map[string]any{"instance_id": "i1", "seq": 1, "events": evs}, 200)
}

func (c *coord) usageBytes(salt string) int64 {
	c.t.Helper()
	if salt == "" {
		salt = "_default"
	}
	m := c.must("GET", "/quota/"+url.PathEscape(salt), nil, 200)
	return int64(m["usage_gb"].(float64)*(1<<30) + 0.5)
}

// mpServer is a fake MP server (httptest) recording what the coordinator
// sends it.
type mpServer struct {
	*httptest.Server
	mu          sync.Mutex
	deletes     [][]objkey.Encoded
	rawDeletes  []string
	deleteCode  int
	listQueries []url.Values
	pages       []mpPage
	failPage    int // 1-based page index answering 503; 0 = none
	prefetches  []map[string]any
	submitCode  int
	submitBody  string
	statusCode  int
	statusBody  string
	// auths is the Authorization header of every request, in arrival order.
	auths []string
	// deleteReply, when set, replaces the DELETE /cache/objects body.
	deleteReply string
	// onList, when set, runs before GET /cache/objects answers its nth
	// page (1-based), after the page was chosen.
	onList func(n int)
}

type mpPage struct {
	entries []any
	next    *string
}

func newMP(t testing.TB) *mpServer {
	m := &mpServer{deleteCode: 200, submitCode: 202, submitBody: `{"request_id":"abc","chunks":2,"status":"submitted"}`,
		statusCode: 200, statusBody: `{"status":"completed","found_keys":2,"total_keys":2}`}
	mux := http.NewServeMux()
	mux.HandleFunc("DELETE /cache/objects", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body struct {
			Keys []objkey.Encoded `json:"keys"`
		}
		_ = json.Unmarshal(raw, &body)
		m.mu.Lock()
		m.deletes = append(m.deletes, body.Keys)
		m.rawDeletes = append(m.rawDeletes, string(raw))
		code, reply := m.deleteCode, m.deleteReply
		m.mu.Unlock()
		w.WriteHeader(code)
		if reply != "" {
			fmt.Fprint(w, reply)
			return
		}
		fmt.Fprintf(w, `{"deleted":%d,"skipped":0,"ok":true}`, len(body.Keys))
	})
	mux.HandleFunc("GET /cache/objects", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.listQueries = append(m.listQueries, r.URL.Query())
		n := len(m.listQueries)
		if n == m.failPage || n > len(m.pages) {
			m.mu.Unlock()
			w.WriteHeader(503)
			fmt.Fprint(w, `{"detail":"unavailable"}`)
			return
		}
		p, onList := m.pages[n-1], m.onList
		m.mu.Unlock()
		if onList != nil {
			onList(n)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"adapter": "fs", "entries": p.entries, "next_page_token": p.next})
	})
	mux.HandleFunc("POST /cache/prefetches", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		m.mu.Lock()
		m.prefetches = append(m.prefetches, body)
		code, out := m.submitCode, m.submitBody
		m.mu.Unlock()
		w.WriteHeader(code)
		fmt.Fprint(w, out)
	})
	mux.HandleFunc("GET /cache/prefetches/{id}", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		code, out := m.statusCode, m.statusBody
		m.mu.Unlock()
		w.WriteHeader(code)
		fmt.Fprint(w, out)
	})
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.auths = append(m.auths, r.Header.Get("Authorization"))
		m.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(m.Close)
	return m
}

// authHeaders returns the Authorization header of every request so far.
func (m *mpServer) authHeaders() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.auths...)
}

func (m *mpServer) hostPort() (string, int) {
	u, _ := url.Parse(m.URL)
	h, p, _ := net.SplitHostPort(u.Host)
	n, _ := strconv.Atoi(p)
	return h, n
}

func (m *mpServer) register(c *coord, id string) {
	h, p := m.hostPort()
	c.must("POST", "/instances", map[string]any{"instance_id": id, "ip": h, "http_port": p}, 200)
}

func (m *mpServer) deleteBatches() [][]objkey.Encoded {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]objkey.Encoded(nil), m.deletes...)
}

// waitFor polls cond until it holds or 10 s pass (a liveness bound, not a
// timing assertion).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, 10*time.Second, what, cond)
}

func newServer(cfg config.Config) (*coordinator.Server, error) {
	return coordinator.New(cfg, coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
}
