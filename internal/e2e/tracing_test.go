package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/tracing/otlptest"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// traceRun starts a server exporting to an in-process OTLP/gRPC receiver at
// level, stores 8 chunks over HTTP (written behind to an fs adapter), looks
// them up over ZMQ, stops the server (which flushes) and returns the spans.
func traceRun(t *testing.T, level string) []otlptest.Span {
	rcv := otlptest.Start(t)
	httpPort, zmqPort := freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	p := start(t, "server-trace-"+level, nil, "server", "--http-port", itoa(httpPort), "--port", itoa(zmqPort),
		"--chunk-size", itoa(chunkSize), "--l1-size-gb", "0.0625",
		"--register-model", `{"model_name":"m","world_size":1,"object_bytes":8192}`,
		"--l2-adapter", `{"type":"fs","base_path":"`+t.TempDir()+`"}`,
		"--enable-tracing", "--otlp-endpoint", "http://"+rcv.Addr, "--trace-level", level)
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))
	toks := tokens(500)
	hdr := map[string]string{"X-LMCache-Model": "m", "X-LMCache-Tokens": tokenHeader(toks)}
	if code, _ := call(t, "POST", base+"/api/kv/store", bytes.Repeat([]byte{7}, 8*8192), hdr, nil); code != http.StatusOK {
		t.Fatalf("store: %d", code)
	}
	c, err := mqclient.Dial("tcp://127.0.0.1:"+itoa(zmqPort), mqclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]wire.Int, len(toks))
	for i, v := range toks {
		ids[i] = wire.Int(v)
	}
	key := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: ids, End: wire.Int(len(ids)), RequestID: "trace", NumKVReaders: 1}
	if hits, err := c.LookupWait(key, 10*time.Millisecond); err != nil || hits != 8 {
		t.Fatalf("LOOKUP: %d hits, %v", hits, err)
	}
	if err := c.FreeLookupLocks(key, 1); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if level == "storage" {
		rcv.WaitFor(t, 30*time.Second, "l2.store span", func(s []otlptest.Span) bool { return len(otlptest.Named(s, "l2.store")) > 0 })
	}
	p.Stop(t) // SIGTERM: the server flushes its spans before exiting
	return rcv.WaitFor(t, 30*time.Second, "LOOKUP and store spans", func(s []otlptest.Span) bool {
		return len(otlptest.Named(s, "LOOKUP")) == 1 && len(otlptest.Named(s, "POST /api/kv/store")) == 1
	})
}

// TestTracingOTLPExport: with --enable-tracing the real binary exports, over
// OTLP/gRPC, a LOOKUP span (model, token and chunk counts, no token ids), an
// HTTP store span named by its route and, at level storage, the write-behind
// l2.store span (adapter, keys, bytes) as a child of the store request.
func TestTracingOTLPExport(t *testing.T) {
	spans := traceRun(t, "storage")
	look := otlptest.Named(spans, "LOOKUP")[0]
	for k, want := range map[string]string{"lmcache.model_name": "m", "lmcache.num_tokens": itoa(8 * chunkSize), "lmcache.num_chunks": "8", "lmcache.world_size": "1"} {
		if look.Attrs[k] != want {
			t.Errorf("LOOKUP %s = %q, want %q (attrs %v)", k, look.Attrs[k], want, look.Attrs)
		}
	}
	if look.Resource["service.name"] != "lmcache-mp-server" {
		t.Errorf("resource %v", look.Resource)
	}
	st := otlptest.Named(spans, "POST /api/kv/store")[0]
	if st.Attrs["http.route"] != "/api/kv/store" || st.Attrs["http.response.status_code"] != "200" {
		t.Errorf("store span attrs %v", st.Attrs)
	}
	l2 := otlptest.Named(spans, "l2.store")[0]
	if l2.Attrs["lmcache.l2.adapter"] != "fs" || l2.Attrs["lmcache.l2.keys"] != "8" || l2.Attrs["lmcache.bytes"] != itoa(8*8192) {
		t.Errorf("l2.store attrs %v", l2.Attrs)
	}
	if l2.ParentID != st.SpanID || l2.TraceID != st.TraceID {
		t.Errorf("l2.store parent %s trace %s, want the store request's span %s of trace %s", l2.ParentID, l2.TraceID, st.SpanID, st.TraceID)
	}
}

// TestTracingEventsLevelTopOnly: at --trace-level events only the request
// spans arrive, no l2.* span.
func TestTracingEventsLevelTopOnly(t *testing.T) {
	spans := traceRun(t, "events")
	for _, s := range spans {
		if len(s.Name) > 3 && s.Name[:3] == "l2." {
			t.Errorf("storage span %q at level events", s.Name)
		}
	}
}

// TestTracingDroppedSpansOnMetrics: the real binaries hand the spans their
// exporter lost to their own counters. `lmcache server` and `lmcache
// coordinator` export to a port nobody listens on; after one request each,
// /metrics shows the loss under reason export_failed, and the queue_full
// series is there at 0 (one request cannot fill the queue). With JSON logs
// (--log-format json, LMCACHE_LOG_FORMAT=json) the SDK's export error is
// one of the records (throttled), not a plain line from the standard log
// package.
func TestTracingDroppedSpansOnMetrics(t *testing.T) {
	env := []string{"OTEL_EXPORTER_OTLP_TIMEOUT=300", "OTEL_BSP_SCHEDULE_DELAY=50"} // ms: export at once, give up fast
	dead := "127.0.0.1:" + itoa(freePort(t))
	httpPort := itoa(freePort(t))
	server := "http://127.0.0.1:" + httpPort
	srv := start(t, "server-dead-collector", env, "server", "--http-port", httpPort, "--port", itoa(freePort(t)), "--l1-size-gb", "0.0625",
		"--log-format", "json", "--enable-tracing", "--otlp-endpoint", dead)
	coordPort := itoa(freePort(t))
	coord := "http://127.0.0.1:" + coordPort
	crd := start(t, "coordinator-dead-collector", append(append(env, noResync...), "LMCACHE_LOG_FORMAT=json"), "coordinator", "--host", "127.0.0.1",
		"--port", coordPort, "--health-check-interval", "0", "--eviction-check-interval", "0", "--enable-tracing", "--otlp-endpoint", dead)
	waitFor(t, "server healthcheck", healthy(server+"/healthcheck"))
	waitFor(t, "coordinator healthz", healthy(coord+"/healthz"))
	for _, svc := range []struct{ base, path, prefix string }{{server, "/", "lmcache_mp"}, {coord, "/quota", "lmcache_coordinator"}} {
		base := svc.base
		failed, full := svc.prefix+`_trace_spans_dropped_total{reason="export_failed"}`, svc.prefix+`_trace_spans_dropped_total{reason="queue_full"}`
		if v := scrape(base, full); v != 0 {
			t.Fatalf("%s = %v before any request, want 0", full, v)
		}
		if code, _ := call(t, "GET", base+svc.path, nil, nil, nil); code != http.StatusOK {
			t.Fatalf("GET %s%s: %d", base, svc.path, code)
		}
		waitFor(t, failed+" to count the lost spans", func() bool { return scrape(base, failed) >= 1 })
		if v := scrape(base, full); v != 0 {
			t.Errorf("%s = %v, want 0", full, v)
		}
	}
	for name, p := range map[string]*proc{"server": srv, "coordinator": crd} {
		p.Stop(t)
		exportErrors := 0
		for _, line := range strings.Split(strings.TrimSpace(p.Output(t)), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Errorf("%s: a log line is not JSON: %q", name, line)
				continue
			}
			// The server names the level as upstream's Python does.
			if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, "opentelemetry error") && (rec["level"] == "WARN" || rec["level"] == "WARNING") {
				exportErrors++
			}
		}
		if exportErrors == 0 {
			t.Errorf("%s: no JSON record of the failed export:\n%s", name, p.Output(t))
		}
	}
}
