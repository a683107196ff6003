package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime/multipart"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/loglevel"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

func metricValue(t *testing.T, body, series string) (float64, bool) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.eE+-]+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

func TestMetricsAndReset(t *testing.T) {
	e := start(t, envOpts{})
	e.store(tokens(0, 2*testChunk), "s1", payload(2, 1))
	kv := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, 2*testChunk), httpapi.HeaderCacheSalt: "s1"}
	e.expect(200, "POST", "/api/kv/lookup", nil, kv)
	waitFor(t, "write-behind", func() bool { return len(e.waitListed(2)) == 2 })
	r := e.expect(200, "GET", "/metrics", nil)
	if !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("content type %q", r.header.Get("Content-Type"))
	}
	body := string(r.body)
	for _, name := range []string{
		"lmcache_mp_l1_memory_usage_bytes", "lmcache_mp_l1_usage_ratio", "lmcache_mp_l1_eviction_loop_ticks_total",
		"lmcache_mp_l1_eviction_loop_triggered_total", `lmcache_mp_l2_usage_bytes{l2_name="fs"}`, "lmcache_mp_active_prefetch_jobs",
		`lmcache_mp_l1_write_chunks_total{cache_salt="s1"}`, `lmcache_mp_l2_store_completed_requests_total{l2_name="fs"}`,
		`target_info{service_instance_id="test-instance",service_name="lmcache-mp"}`, "go_goroutines",
	} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	series := `lmcache_mp_lookups_requests_total{cache_salt="s1",model_name="org/model"}`
	if v, ok := metricValue(t, body, series); !ok || v != 1 {
		t.Fatalf("%s = %v (%v)", series, v, ok)
	}
	if v, ok := metricValue(t, body, `lmcache_mp_lookup_hit_tokens_total{cache_salt="s1",model_name="org/model"}`); !ok || v != 2*testChunk {
		t.Fatalf("hit tokens = %v (%v)", v, ok)
	}
	if v, ok := metricValue(t, body, `lmcache_mp_l1_write_chunks_total{cache_salt="s1"}`); !ok || v != 2 {
		t.Fatalf("l1 writes = %v (%v)", v, ok)
	}
	if r := e.expect(200, "POST", "/metrics/reset", nil); string(r.body) != "ok" || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("reset = %q", r.body)
	}
	body = string(e.expect(200, "GET", "/metrics", nil).body)
	if _, ok := metricValue(t, body, series); ok {
		t.Fatalf("lookup counter survived reset")
	}
	if v, ok := metricValue(t, body, `lmcache_mp_l1_write_chunks_total{cache_salt="s1"}`); !ok || v != 0 {
		t.Fatalf("engine counter after reset = %v (%v)", v, ok)
	}
	if v, ok := metricValue(t, body, "lmcache_mp_l1_memory_usage_bytes"); !ok || v < 2*objBytes {
		t.Fatalf("gauge after reset = %v (%v); gauges are live state and must not reset", v, ok)
	}
}

func TestLogLevel(t *testing.T) {
	e := start(t, envOpts{})
	if r := e.expect(200, "GET", "/loglevel", nil); !strings.HasPrefix(string(r.body), "=== Loggers and Levels ===\n") || !strings.Contains(string(r.body), "\nroot: INFO\n") {
		t.Fatalf("list = %q", r.body)
	}
	if r := e.expect(200, "GET", "/loglevel?logger_name=lmcache.engine", nil); string(r.body) != "lmcache.engine: INFO" {
		t.Fatalf("read = %q", r.body)
	}
	if r := e.expect(200, "GET", "/loglevel?logger_name=lmcache&level=debug", nil); string(r.body) != "Set lmcache level to DEBUG (including all handlers)" {
		t.Fatalf("set = %q", r.body)
	}
	// Children inherit through dotted names.
	if r := e.expect(200, "GET", "/loglevel?logger_name=lmcache.engine", nil); string(r.body) != "lmcache.engine: DEBUG" {
		t.Fatalf("inherited = %q", r.body)
	}
	if r := e.expect(200, "GET", "/loglevel", nil); !strings.Contains(string(r.body), "lmcache: DEBUG\n") {
		t.Fatalf("list = %q", r.body)
	}
	if r := e.expect(400, "GET", "/loglevel?logger_name=lmcache&level=LOUD", nil); !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") || string(r.body) != "Invalid log level: LOUD" {
		t.Fatalf("400 = %q (%q)", r.body, r.header.Get("Content-Type"))
	}
	if r := e.expect(200, "GET", "/loglevel?logger_name=&level=DEBUG", nil); string(r.body) != "null" {
		t.Fatalf("empty logger_name = %q", r.body)
	}
	if r := e.expect(200, "GET", "/loglevel?level=DEBUG", nil); string(r.body) != "null" {
		t.Fatalf("level only = %q", r.body)
	}
}

func TestThreads(t *testing.T) {
	e := start(t, envOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go pprof.Do(ctx, pprof.Labels("name", "Storage-Flush-Loop"), func(ctx context.Context) {
		defer wg.Done()
		<-ctx.Done()
	})
	defer func() { cancel(); wg.Wait() }()
	r := e.expect(200, "GET", "/threads?name=storage-flush", nil)
	body := string(r.body)
	if !strings.Contains(body, "=== Thread Summary ===\nTotal threads: 1\nTotal goroutines: ") || !strings.Contains(body, `"name":"Storage-Flush-Loop"`) {
		t.Fatalf("filtered threads = %s", body)
	}
	if r := e.expect(200, "GET", "/threads?name=no-such-loop", nil); !strings.Contains(string(r.body), "Total threads: 0\n") {
		t.Fatalf("no match = %s", r.body)
	}
	all := string(e.expect(200, "GET", "/threads", nil).body)
	if !strings.Contains(all, "TestThreads") {
		t.Fatalf("unfiltered dump lacks the test goroutine")
	}
	// thread_id selects one goroutine by id.
	id := regexp.MustCompile(`goroutine (\d+) `).FindStringSubmatch(string(e.expect(200, "GET", "/threads?thread_id=1", nil).body))
	if id == nil || id[1] != "1" {
		t.Fatalf("thread_id=1 did not return goroutine 1")
	}
	e.expect(422, "GET", "/threads?thread_id=x", nil)
}

func TestPeriodicThreads(t *testing.T) {
	e := start(t, envOpts{})
	now := time.Now()
	var clockMu sync.Mutex
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	e.loops.SetClock(clock)
	runs := 0
	flush := e.loops.Register("storage-flush", periodic.Critical, 5*time.Second, 0, func(context.Context) (periodic.Summary, error) {
		runs++
		if runs == 2 {
			return periodic.Summary{}, errors.New("disk full")
		}
		return periodic.Summary{Message: "flushed=3", Extra: map[string]string{"keys": "3"}}, nil
	})
	e.loops.Register("idle-low", periodic.Low, time.Second, 0, func(context.Context) (periodic.Summary, error) {
		return periodic.Summary{}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	// The loop runs (is_running) but its first cycle waits out a long init.
	started := make(chan struct{})
	go func() {
		defer wg.Done()
		close(started)
		flush.Run(ctx)
	}()
	defer func() { cancel(); wg.Wait() }()
	<-started
	waitFor(t, "loop start and first run", func() bool { st, _ := e.loops.Get("storage-flush"); return st.TotalRuns >= 1 })
	cancel()
	wg.Wait()
	_ = flush.RunOnce(context.Background()) // the failing run

	m := e.expect(200, "GET", "/periodic-threads", nil).json(t)
	sum := m["summary"].(map[string]any)
	if sum["total_count"] != float64(2) || sum["by_level"].(map[string]any)["critical"].(map[string]any)["total"] != float64(1) {
		t.Fatalf("summary = %v", sum)
	}
	if m := e.expect(200, "GET", "/periodic-threads?level=low", nil).json(t); len(m["threads"].([]any)) != 1 || m["summary"].(map[string]any)["total_count"] != float64(2) {
		t.Fatalf("level filter = %v", m)
	}
	if m := e.expect(200, "GET", "/periodic-threads?running_only=true", nil).json(t); len(m["threads"].([]any)) != 0 {
		t.Fatalf("running_only = %v", m)
	}
	if m := e.expect(400, "GET", "/periodic-threads?level=urgent", nil).json(t); m["error"] != "Invalid level: urgent. Valid values: critical, high, medium, low" {
		t.Fatalf("400 = %v", m)
	}
	st := e.expect(200, "GET", "/periodic-threads/storage-flush", nil).json(t)
	if st["name"] != "storage-flush" || st["level"] != "critical" || st["interval"] != float64(5) || st["total_runs"] != float64(2) || st["failed_runs"] != float64(1) || st["success_rate"] != float64(50) {
		t.Fatalf("status = %v", st)
	}
	if ls := st["last_summary"].(map[string]any); ls["success"] != false || ls["message"] != "disk full" {
		t.Fatalf("last_summary = %v", ls)
	}
	if m := e.expect(404, "GET", "/periodic-threads/nope", nil).json(t); m["error"] != "Thread not found: nope" {
		t.Fatalf("404 = %v", m)
	}
	if m := e.expect(200, "GET", "/periodic-threads-health", nil).json(t); m["healthy"] != true || m["unhealthy_count"] != float64(0) {
		t.Fatalf("health = %v", m)
	}

	// A critical loop that runs but has not ticked for 3 intervals is unhealthy.
	stuckCtx, stuckCancel := context.WithCancel(context.Background())
	block := make(chan struct{})
	stuck := e.loops.Register("stuck-critical", periodic.Critical, time.Second, 0, func(ctx context.Context) (periodic.Summary, error) {
		<-block
		return periodic.Summary{}, nil
	})
	wg.Add(1)
	go func() { defer wg.Done(); stuck.Run(stuckCtx) }()
	defer func() { close(block); stuckCancel(); wg.Wait() }()
	waitFor(t, "stuck loop running", func() bool { st, _ := e.loops.Get("stuck-critical"); return st.IsRunning })
	clockMu.Lock()
	now = now.Add(10 * time.Second)
	clockMu.Unlock()
	m = e.expect(200, "GET", "/periodic-threads-health", nil).json(t)
	bad := m["unhealthy_threads"].([]any)
	if m["healthy"] != false || m["unhealthy_count"] != float64(1) || bad[0].(map[string]any)["name"] != "stuck-critical" {
		t.Fatalf("unhealthy = %v", m)
	}
}

func TestEnvRedaction(t *testing.T) {
	environ := func() []string {
		return []string{"HOME=/root", "AWS_SECRET_ACCESS_KEY=abc", "LMCACHE_HTTP_AUTH_TOKEN=t0k", "LMCACHE_LOG_LEVEL=INFO", "DB_PASSWORD=pw"}
	}
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.Environ = environ }})
	r := e.expect(200, "GET", "/env", nil)
	if !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("content type = %q", r.header.Get("Content-Type"))
	}
	m := r.json(t)
	if m["HOME"] != "/root" || m["LMCACHE_LOG_LEVEL"] != "INFO" || m["AWS_SECRET_ACCESS_KEY"] != httpapi.Redacted || m["LMCACHE_HTTP_AUTH_TOKEN"] != httpapi.Redacted || m["DB_PASSWORD"] != httpapi.Redacted {
		t.Fatalf("env = %v", m)
	}
	if i, j := strings.Index(string(r.body), "AWS_"), strings.Index(string(r.body), "HOME"); i < 0 || j < i || !strings.Contains(string(r.body), "\n  \"") {
		t.Fatalf("env not sorted and indented: %s", r.body)
	}
	e = start(t, envOpts{mutate: func(o *httpapi.Options) { o.Environ = environ; o.EnvShowSecrets = true }})
	if m := e.expect(200, "GET", "/env", nil).json(t); m["AWS_SECRET_ACCESS_KEY"] != "abc" {
		t.Fatalf("unredacted env = %v", m)
	}
}

func scriptForm(t *testing.T, field, src string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, err := mw.CreateFormFile(field, "s.star")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write([]byte(src))
	_ = mw.Close()
	return buf.Bytes(), mw.FormDataContentType()
}

func TestRunScript(t *testing.T) {
	e := start(t, envOpts{})
	body, ct := scriptForm(t, "script", "result = 1")
	e.expect(404, "POST", "/run_script", body, map[string]string{"Content-Type": ct})

	e = start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.RunScriptEnabled = true
		o.ScriptAllowedImports = []string{"json"}
		o.ScriptMaxSteps = 100_000
		o.ScriptTimeout = 5 * time.Second
	}})
	run := func(code int, field, src string) string {
		t.Helper()
		body, ct := scriptForm(t, field, src)
		r := e.expect(code, "POST", "/run_script", body, map[string]string{"Content-Type": ct})
		if !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
			t.Fatalf("content type = %q", r.header.Get("Content-Type"))
		}
		return string(r.body)
	}
	if got := run(200, "script", `load("json", "json")
st = app.status()
ads = app.adapters()
result = json.encode({"v": app.version, "engine": st["is_healthy"] != None, "adapters": [a["TypeName"] for a in ads]})`); got != `{"adapters":["fs","nolist","dax","gen"],"engine":true,"v":"0.3.1"}` {
		t.Fatalf("result = %q", got)
	}
	if got := run(200, "script", "x = 1 + 1"); got != "Script executed successfully" {
		t.Fatalf("no result = %q", got)
	}
	if got := run(400, "file", "result = 1"); got != "No script file provided" {
		t.Fatalf("missing field = %q", got)
	}
	if got := run(500, "script", `load("math", "math")`); !strings.HasPrefix(got, "Error executing script: ") || !strings.Contains(got, "Import of 'math' is not allowed") {
		t.Fatalf("forbidden import = %q", got)
	}
	if got := run(500, "script", "def f():\n    for i in range(100000000):\n        pass\nf()"); !strings.Contains(got, "too many steps") {
		t.Fatalf("step limit = %q", got)
	}
	if got := run(500, "script", "result = 1 // 0"); !strings.Contains(got, "division by zero") {
		t.Fatalf("runtime error = %q", got)
	}
}

// TestAuthToken checks that mutating and sensitive routes require the
// bearer token and probes stay open.

// TestLogLevelBoundsNewLoggers: setting levels of ever new logger names
// stops at loglevel.MaxLoggers with a 400 (plain text, as the route's
// other errors), while a known logger's level can still be set.
func TestLogLevelBoundsNewLoggers(t *testing.T) {
	e := start(t, envOpts{})
	for i := 0; ; i++ {
		r := e.do("GET", fmt.Sprintf("/loglevel?logger_name=bound.%d&level=debug", i), nil, nil)
		if r.code == 200 {
			if i > loglevel.MaxLoggers {
				t.Fatalf("logger %d accepted, past the bound %d", i, loglevel.MaxLoggers)
			}
			continue
		}
		if want := fmt.Sprintf("Too many loggers: %d are known; set the level of an existing one", loglevel.MaxLoggers); r.code != 400 || string(r.body) != want {
			t.Fatalf("logger %d: %d %s, want 400 %s", i, r.code, r.body, want)
		}
		break
	}
	e.expect(200, "GET", "/loglevel?logger_name=bound.0&level=error", nil)
}

// TestLogLevelBoundsNameLength: a name past loglevel.MaxNameBytes is
// refused with a 400 naming its length, nothing is created, and a name of
// exactly the bound is set.
func TestLogLevelBoundsNameLength(t *testing.T) {
	e := start(t, envOpts{})
	long := strings.Repeat("n", loglevel.MaxNameBytes+1)
	r := e.do("GET", "/loglevel?logger_name="+long+"&level=debug", nil, nil)
	if want := fmt.Sprintf("Logger name too long: %d bytes (at most %d)", loglevel.MaxNameBytes+1, loglevel.MaxNameBytes); r.code != 400 || string(r.body) != want {
		t.Fatalf("a %d-byte name: %d %s, want 400 %s", len(long), r.code, r.body, want)
	}
	if list := string(e.expect(200, "GET", "/loglevel", nil).body); strings.Contains(list, "nnnn") {
		t.Fatalf("the refused name was created:\n%s", list)
	}
	ok := long[:loglevel.MaxNameBytes]
	if r := e.expect(200, "GET", "/loglevel?logger_name="+ok+"&level=debug", nil); string(r.body) != "Set "+ok+" level to DEBUG (including all handlers)" {
		t.Fatalf("a name of exactly the bound: %s", r.body)
	}
}
