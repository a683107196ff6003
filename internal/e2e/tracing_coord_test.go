package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/tracing/otlptest"
)

// coordTraffic sends the coordinator at base one ingest (POST /quota/events
// with two 100-byte store events for salt "t") and one read (GET /quota/t),
// both 200.
func coordTraffic(t *testing.T, base string) {
	t.Helper()
	store := func(hash string) map[string]any {
		return map[string]any{"type": "store", "bytes": 100, "key": map[string]any{
			"chunk_hash_hex": hash, "model_name": "m", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": "t"}}
	}
	if code, _ := call(t, "POST", base+"/quota/events", map[string]any{"instance_id": "mp-1", "seq": 1, "events": []any{store("0a"), store("0b")}}, nil, nil); code != http.StatusOK {
		t.Fatalf("POST /quota/events: %d", code)
	}
	var q struct {
		CacheSalt string  `json:"cache_salt"`
		UsageGB   float64 `json:"usage_gb"`
	}
	if code, _ := call(t, "GET", base+"/quota/t", nil, nil, &q); code != http.StatusOK || q.CacheSalt != "t" || q.UsageGB != 200.0/(1<<30) {
		t.Fatalf("GET /quota/t: %d %+v, want 200 with salt t and 200 bytes", code, q)
	}
}

// TestCoordinatorTracingOTLPExport: `lmcache coordinator --enable-tracing
// --otlp-endpoint` exports a server span per HTTP request over OTLP/gRPC,
// named by the route pattern, with the route, method, path and status, under
// the resource service.name lmcache-mp-coordinator. A coordinator given the
// endpoint but not --enable-tracing exports nothing.
func TestCoordinatorTracingOTLPExport(t *testing.T) {
	rcv := otlptest.Start(t)
	port := itoa(freePort(t))
	base := "http://127.0.0.1:" + port
	p := start(t, "coordinator-trace", noResync, "coordinator", "--host", "127.0.0.1", "--port", port,
		"--health-check-interval", "0", "--eviction-check-interval", "0",
		"--enable-tracing", "--otlp-endpoint", "http://"+rcv.Addr, "--trace-level", "events")
	waitFor(t, "healthz", healthy(base+"/healthz"))
	coordTraffic(t, base)
	p.Stop(t) // SIGTERM: the coordinator flushes its spans before exiting
	spans := rcv.WaitFor(t, 30*time.Second, "the ingest and read spans", func(s []otlptest.Span) bool {
		return len(otlptest.Named(s, "POST /quota/events")) == 1 && len(otlptest.Named(s, "GET /quota/{cache_salt}")) == 1
	})
	for name, want := range map[string]map[string]string{
		"POST /quota/events":      {"http.route": "/quota/events", "http.request.method": "POST", "url.path": "/quota/events", "http.response.status_code": "200"},
		"GET /quota/{cache_salt}": {"http.route": "/quota/{cache_salt}", "http.request.method": "GET", "url.path": "/quota/t", "http.response.status_code": "200"},
	} {
		s := otlptest.Named(spans, name)[0]
		for k, v := range want {
			if s.Attrs[k] != v {
				t.Errorf("%s: %s = %q, want %q (attrs %v)", name, k, s.Attrs[k], v, s.Attrs)
			}
		}
		if s.Resource["service.name"] != "lmcache-mp-coordinator" || s.ParentID != "" {
			t.Errorf("%s: resource %v, parent %q; want service.name lmcache-mp-coordinator and a root span", name, s.Resource, s.ParentID)
		}
	}

	off := otlptest.Start(t)
	port = itoa(freePort(t))
	base = "http://127.0.0.1:" + port
	q := start(t, "coordinator-no-trace", noResync, "coordinator", "--host", "127.0.0.1", "--port", port,
		"--health-check-interval", "0", "--eviction-check-interval", "0", "--otlp-endpoint", "http://"+off.Addr)
	waitFor(t, "healthz", healthy(base+"/healthz"))
	coordTraffic(t, base)
	q.Stop(t) // the process has exited: anything it would have sent was sent
	if got := off.Spans(); len(got) != 0 {
		t.Errorf("without --enable-tracing the coordinator exported %d spans: %v", len(got), got)
	}
}

// TestCoordinatorTracingFlagErrors: tracing without an endpoint, a bad
// endpoint and a bad level are each one line and exit 2, as for the server.
func TestCoordinatorTracingFlagErrors(t *testing.T) {
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"coordinator", "--enable-tracing"}, "lmcache coordinator: --enable-tracing: requires --otlp-endpoint (an OTLP gRPC endpoint such as http://localhost:4317) (got True)"},
		{[]string{"LMCACHE_MP_COORDINATOR_ENABLE_TRACING=1"}, []string{"coordinator", "--otlp-endpoint", "ftp://collector:4317"}, `lmcache coordinator: --otlp-endpoint "ftp://collector:4317": scheme must be http or https`},
		{nil, []string{"coordinator", "--trace-level", "all"}, `lmcache coordinator: --trace-level: must be storage or events (got "all")`},
	} {
		code, stdout, stderr := runBin(t, c.env, c.args...)
		if code != 2 || stderr != c.want+"\n" || stdout != "" {
			t.Errorf("%v %v: exit %d, stderr %q, stdout %q; want 2 and %q", c.env, c.args, code, stderr, stdout, c.want)
		}
	}
}
