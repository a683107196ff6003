package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/tracing/otlptest"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// zmqTraceChunks is how many chunks the engine-driven trace run stores.
const zmqTraceChunks = 4

// zmqTraceObjectBytes is one chunk's object under kvRegistration: K and V
// of 2 layers x chunkSize tokens x 64 hidden x fp16.
const zmqTraceObjectBytes = 2 * 2 * chunkSize * 64 * 2

// zmqTraceRun drives a real server through the engine-driven data path with
// tracing at level: a worker registers, stores zmqTraceChunks chunks
// (PREPARE_STORE, COMMIT_STORE; written behind to an fs adapter), L1 is
// cleared so the LOOKUP has to go to L2, then PREPARE_RETRIEVE and
// COMMIT_RETRIEVE read the loaded chunks. It returns the spans received.
func zmqTraceRun(t *testing.T, level string) []otlptest.Span {
	rcv := otlptest.Start(t)
	httpPort, zmqPort := freePort(t), freePort(t)
	shm := shmName(t, "trace"+level)
	// Spans leave in batches every 100 ms, so they arrive while the server
	// runs (cleanup stops it).
	start(t, "server-trace-zmq-"+level, []string{"OTEL_BSP_SCHEDULE_DELAY=100"}, "server", "--http-port", itoa(httpPort), "--port", itoa(zmqPort),
		"--chunk-size", itoa(chunkSize), "--l1-size-gb", "0.03125", "--shm-name", shm,
		"--l2-adapter", `{"type":"fs","base_path":"`+t.TempDir()+`"}`,
		"--enable-tracing", "--otlp-endpoint", "http://"+rcv.Addr, "--trace-level", level)
	waitFor(t, "healthcheck", healthy("http://127.0.0.1:"+itoa(httpPort)+"/healthcheck"))
	w := dialWorker(t, zmqPort, shm)
	ids := make([]wire.Int, zmqTraceChunks*chunkSize)
	for i := range ids {
		ids[i] = wire.Int(1000 + i*13)
	}
	key := &wire.Key{ModelName: "m", WorldSize: 1, WorkerID: wire.SomeInt(0), TokenIDs: ids, End: wire.Int(len(ids)),
		RequestID: "trace-" + level, NumKVReaders: 1}
	plan, err := w.c.PrepareStore(key, 1)
	if err != nil || len(plan.Slots) != zmqTraceChunks {
		t.Fatalf("PREPARE_STORE: %+v, %v", plan, err)
	}
	if ok, err := w.c.CommitStore(key, 1, nil); err != nil || !ok {
		t.Fatalf("COMMIT_STORE = %v, %v", ok, err)
	}
	// The upload lands before L1 is cleared, so the lookup finds it in L2.
	waitFor(t, "write-behind of the chunks", func() bool {
		return metricSum(t, "http://127.0.0.1:"+itoa(httpPort), "lmcache_mp_l2_store_completed_objects_chunks_total") == zmqTraceChunks
	})
	if err := w.c.Clear(false); err != nil {
		t.Fatal(err)
	}
	if hits, err := w.c.LookupWait(key, 10*time.Millisecond); err != nil || hits != zmqTraceChunks {
		t.Fatalf("LOOKUP after clear: %d hits, %v", hits, err)
	}
	if ok, slots, err := w.c.PrepareRetrieve(key, 1); err != nil || !ok || len(slots) != zmqTraceChunks {
		t.Fatalf("PREPARE_RETRIEVE = %v, %d slots, %v", ok, len(slots), err)
	}
	if ok, err := w.c.CommitRetrieve(key, 1); err != nil || !ok {
		t.Fatalf("COMMIT_RETRIEVE = %v, %v", ok, err)
	}
	return rcv.WaitFor(t, 30*time.Second, "the request and L2 spans", func(s []otlptest.Span) bool {
		for _, n := range zmqTracedOps {
			if len(otlptest.Named(s, n)) != 1 {
				return false
			}
		}
		// At level storage the L2 spans end before the LOOKUP is answered
		// and the upload before its metric moves, so they are in the same
		// or an earlier batch.
		return level != "storage" || len(otlptest.Named(s, "l2.load")) == 1
	})
}

var zmqTracedOps = []string{"PREPARE_STORE", "COMMIT_STORE", "LOOKUP", "PREPARE_RETRIEVE", "COMMIT_RETRIEVE"}

// checkRequestSpans: each ZMQ request span is a root span with the key's
// model, token, chunk and world-size counts.
func checkRequestSpans(t *testing.T, spans []otlptest.Span) map[string]otlptest.Span {
	t.Helper()
	out := map[string]otlptest.Span{}
	for _, n := range zmqTracedOps {
		s := otlptest.Named(spans, n)[0]
		out[n] = s
		want := map[string]string{"lmcache.model_name": "m", "lmcache.num_tokens": itoa(zmqTraceChunks * chunkSize),
			"lmcache.num_chunks": itoa(zmqTraceChunks), "lmcache.world_size": "1"}
		for k, v := range want {
			if s.Attrs[k] != v {
				t.Errorf("%s %s = %q, want %q (attrs %v)", n, k, s.Attrs[k], v, s.Attrs)
			}
		}
		if s.ParentID != "" || s.Resource["service.name"] != "lmcache-mp-server" {
			t.Errorf("%s: parent %q resource %v, want a root span of lmcache-mp-server", n, s.ParentID, s.Resource)
		}
	}
	return out
}

// TestTracingZMQStorageLevel: at --trace-level storage the engine-driven
// requests' spans arrive over OTLP/gRPC, and each L2 operation is a child
// of the request that caused it: the write-behind l2.store of COMMIT_STORE
// (adapter fs, the chunks' keys and bytes), the l2.lookup and l2.load of the
// LOOKUP that missed L1 (every key hit), in the request's trace.
func TestTracingZMQStorageLevel(t *testing.T) {
	spans := zmqTraceRun(t, "storage")
	req := checkRequestSpans(t, spans)
	child := func(name, parent string, want map[string]string) {
		t.Helper()
		got := otlptest.Named(spans, name)
		if len(got) != 1 {
			t.Errorf("%d %s spans, want 1 (spans %v)", len(got), name, names(spans))
			return
		}
		s, p := got[0], req[parent]
		if s.ParentID != p.SpanID || s.TraceID != p.TraceID {
			t.Errorf("%s: parent %s trace %s, want the %s span %s of trace %s", name, s.ParentID, s.TraceID, parent, p.SpanID, p.TraceID)
		}
		for k, v := range want {
			if s.Attrs[k] != v {
				t.Errorf("%s %s = %q, want %q (attrs %v)", name, k, s.Attrs[k], v, s.Attrs)
			}
		}
	}
	n := itoa(zmqTraceChunks)
	child("l2.store", "COMMIT_STORE", map[string]string{"lmcache.l2.adapter": "fs", "lmcache.l2.keys": n, "lmcache.bytes": itoa(zmqTraceChunks * zmqTraceObjectBytes)})
	child("l2.lookup", "LOOKUP", map[string]string{"lmcache.l2.adapter": "fs", "lmcache.l2.keys": n, "lmcache.l2.hit_keys": n})
	child("l2.load", "LOOKUP", map[string]string{"lmcache.l2.adapter": "fs", "lmcache.l2.keys": n, "lmcache.l2.hit_keys": n, "lmcache.bytes": itoa(zmqTraceChunks * zmqTraceObjectBytes)})
}

// TestTracingZMQEventsLevel: at --trace-level events the same run exports
// the five request spans and no L2 span.
func TestTracingZMQEventsLevel(t *testing.T) {
	spans := zmqTraceRun(t, "events")
	checkRequestSpans(t, spans)
	for _, s := range spans {
		if strings.HasPrefix(s.Name, "l2.") {
			t.Errorf("storage span %q at level events", s.Name)
		}
	}
}

func names(spans []otlptest.Span) string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return fmt.Sprint(out)
}
