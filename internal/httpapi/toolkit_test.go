package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/polltest"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// canonical re-encodes a JSON document as encoding/json writes a generic
// tree (sorted keys, numbers as written).
func canonical(t *testing.T, b []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dataPathCase is one data path's GET /status contribution, typed as
// internal/mq's Status returns it, and the map[string]any that mq built for
// the same state before it was typed (the body that map produced is the
// one the typed value must still produce).
type dataPathCase struct {
	name  string
	typed *httpapi.DataPathStatus // nil: no data path
	old   map[string]any
}

// dataPathCases: a data path with sessions, an lmcache-driven context and
// the kv-events log and publisher on; an idle one (mq's zero state: no
// ids, no contexts, the log off); and none.
func dataPathCases() []dataPathCase {
	transfer := "lmcache_driven"
	depth, capacity, lost, next, unbound := 3, 5, 0, int64(4), int64(1)
	pub, replay := "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"
	full := httpapi.DataPathStatus{
		ActiveSessions: 3, PendingTransfers: 1, PendingLookups: 0,
		RegisteredGPUIDs: []int64{4, 9},
		CacheContextMeta: map[string]httpapi.CacheContext{"9": {
			ModelName: "org/a<b", WorldSize: 2, Transfer: &transfer,
			KVCacheLayout: httpapi.KVCacheLayout{NumLayers: 2, NumBlocks: 64, CacheSizePerToken: 4096, KernelGroups: []httpapi.KernelGroup{{
				Dtype: "torch.bfloat16", EngineKVFormat: "NHD", HeadSize: 128, LayerIndices: []int64{0, 1},
				NumKVHeads: 8, NumLayers: 2, SlotsPerBlock: 16, TokensPerBlock: 16,
			}}},
		}},
		KVEvents: httpapi.KVEventsStatus{Enabled: true, Incarnation: 77, LogDepth: &depth, LogCapacity: &capacity, LostMarkers: &lost,
			NextSeq: &next, UnboundStores: &unbound, PublisherEndpoint: &pub, ReplayEndpoint: &replay},
	}
	fullOld := map[string]any{
		"active_sessions": 3, "pending_transfers": 1, "pending_lookups": 0,
		"registered_gpu_ids": []int64{4, 9},
		"cache_context_meta": map[string]any{"9": map[string]any{
			"model_name": "org/a<b", "world_size": 2, "transfer": "lmcache_driven",
			"kv_cache_layout": map[string]any{
				"num_layers": int64(2), "num_blocks": int64(64), "cache_size_per_token": int64(4096),
				"kernel_groups": []map[string]any{{
					"dtype": "torch.bfloat16", "engine_group_idx": 0, "engine_kv_format": "NHD", "head_size": 128, "is_mla": false,
					"kernel_group_idx": 0, "layer_indices": []int64{0, 1}, "num_kv_heads": 8, "num_layers": 2, "object_group_idx": 0,
					"slots_per_block": 16, "tokens_per_block": 16,
				}},
			},
		}},
		"kv_events": map[string]any{"enabled": true, "incarnation": int64(77), "log_depth": 3, "log_capacity": 5, "lost_markers": 0,
			"next_seq": int64(4), "unbound_stores": int64(1), "publisher_endpoint": pub, "replay_endpoint": replay},
	}
	idleOld := map[string]any{
		"active_sessions": 0, "pending_transfers": 0, "pending_lookups": 0,
		"registered_gpu_ids": []int64{}, "cache_context_meta": map[string]any{},
		"kv_events": map[string]any{"enabled": false, "incarnation": int64(0)},
	}
	return []dataPathCase{{"full", &full, fullOld}, {"idle", &httpapi.DataPathStatus{}, idleOld}, {"none", nil, nil}}
}

// TestStatusBodyUnchanged: GET /status, a typed StatusResponse over the
// data path's typed DataPathStatus, is byte for byte the body the
// map[string]any handler wrote over the map the data path returned (same
// keys, same nesting, same values, [] and {} where empty): that handler's
// map is rebuilt here as it built it and compared with what is served.
func TestStatusBodyUnchanged(t *testing.T) {
	for _, c := range dataPathCases() {
		e := start(t, envOpts{mutate: func(o *httpapi.Options) {
			if c.typed != nil {
				o.StatusExtra = func() httpapi.DataPathStatus { return *c.typed }
			}
		}})
		for _, path := range []string{"/status", "/api/status"} {
			served := e.expect(200, "GET", path, nil).body
			var got map[string]json.RawMessage
			if err := json.Unmarshal(served, &got); err != nil {
				t.Fatal(err)
			}
			// The handler before: engine fields, the data path's map over
			// them, then model_layouts. storage_manager is the engine's
			// own snapshot (passed through), taken from the answer.
			layouts := e.eng.Layouts()
			ctxMeta := map[string]any{}
			models := []map[string]any{}
			for i, l := range layouts {
				meta := map[string]any{}
				for k, v := range l.Meta {
					meta[k] = v
				}
				ctxMeta[fmt.Sprint(i)] = map[string]any{"model_name": l.ModelName, "world_size": l.WorldSize, "object_bytes": l.ObjectBytes, "kv_cache_layout": meta}
				models = append(models, map[string]any{"model_name": l.ModelName, "world_size": l.WorldSize, "object_bytes": l.ObjectBytes})
			}
			if len(models) != 1 {
				t.Fatalf("the harness's engine has %d layouts, want its one --register-model layout", len(models))
			}
			var sm map[string]any
			if err := json.Unmarshal(got["storage_manager"], &sm); err != nil {
				t.Fatal(err)
			}
			old := map[string]any{
				"is_healthy": sm["is_healthy"], "engine_type": "MPCacheServer", "chunk_size": testChunk,
				"hash_algorithm": tokenhash.Blake3, "active_sessions": 0, "registered_gpu_ids": []int{},
				"cache_context_meta": ctxMeta, "active_prefetch_jobs": e.eng.Counters().ActivePrefetchJobs,
				"storage_manager": got["storage_manager"],
			}
			for k, v := range c.old {
				old[k] = v
			}
			old["model_layouts"] = models
			want, err := json.Marshal(old)
			if err != nil {
				t.Fatal(err)
			}
			if w := canonical(t, want); !bytes.Equal(served, w) {
				t.Errorf("%s %s:\n got  %s\n want %s", c.name, path, served, w)
			}
		}
	}
}

// TestConfigBodyUnchanged: GET /config, now a typed ConfigResponse, is
// byte for byte the indented document the map handler wrote, for the
// three upstream groups, a further group, an empty one and a nil one.
func TestConfigBodyUnchanged(t *testing.T) {
	cfg := map[string]map[string]any{
		"mp":              {"http_host": "127.0.0.1", "chunk_size": testChunk, "note": "a<b&c"},
		"storage_manager": {"l1_size_gb": 0.015625, "l2_adapter": []any{map[string]any{"type": "fs", "base_path": "/tmp/x"}}},
		"observability":   {"disable_metrics": false},
		"coordinator":     {"url": "http://127.0.0.1:1"},
		"empty":           {},
		"unset":           nil,
	}
	e := start(t, envOpts{noEngine: true, mutate: func(o *httpapi.Options) { o.Config = cfg }})
	served := e.expect(200, "GET", "/config", nil).body
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	enc := json.NewEncoder(&want)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(tree); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(served, want.Bytes()) {
		t.Fatalf("GET /config:\n got  %s\n want %s", served, want.Bytes())
	}
	if !strings.Contains(string(served), `"unset": null`) || !strings.Contains(string(served), `"empty": {}`) {
		t.Fatalf("empty and nil groups not kept: %s", served)
	}
}

// TestStatusEncodeFailureUsesRouteShape: a status value that cannot be
// encoded (a data path's context whose layout metadata holds +Inf) is a
// 500 written by the route table in the route's documented
// {"error": ...} shape, not a hand-built body in another shape.
func TestStatusEncodeFailureUsesRouteShape(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.StatusExtra = func() httpapi.DataPathStatus {
			return httpapi.DataPathStatus{CacheContextMeta: map[string]httpapi.CacheContext{
				"1": {KVCacheLayout: httpapi.KVCacheLayout{Meta: map[string]any{"ratio": math.Inf(1)}}},
			}}
		}
	}})
	r := e.expect(500, "GET", "/status", nil)
	m := r.json(t)
	msg, _ := m["error"].(string)
	if len(m) != 1 || !strings.Contains(msg, "unsupported value: +Inf") || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("500 body %s (%s), want {\"error\": ...} naming the value", r.body, r.header.Get("Content-Type"))
	}
}

// streamed sends body without a Content-Length (chunked), so only the
// server's reading, not a declared length, can find it over a limit.
func streamed(t *testing.T, e *env, method, path string, body []byte, hdr map[string]string) resp {
	t.Helper()
	req, err := http.NewRequest(method, e.base+path, io.MultiReader(bytes.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	record(req, res.StatusCode)
	if req.ContentLength != -1 && req.ContentLength != 0 {
		t.Fatalf("request declared a length %d", req.ContentLength)
	}
	return resp{code: res.StatusCode, header: res.Header, body: b}
}

// TestStreamedBodiesOverTheLimit413: the two body limits that do not go
// through httproute.ReadBody (the framed KV store stream and the
// run_script form) use the toolkit's LimitBody/BodyError: a streamed body
// over the limit is 413 in the route's documented shape ({"detail": ...}
// for /api/kv/store, text for /run_script), and so is a declared one. The
// KV stream's chunks (2048 bytes) fit the 2200-byte limit, its frames do
// not, so the limit is found by reading.
func TestStreamedBodiesOverTheLimit413(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.MaxKVBodyBytes = 2200; o.RunScriptEnabled = true }})
	good := kvOne.storeStream(tokSlice(0, 2*testChunk), kvOne.tensor(2, 1), 2, "")
	if len(good) <= 2200 {
		t.Fatalf("stream of %d bytes is not over the 2200-byte limit", len(good))
	}
	r := streamed(t, e, "POST", "/api/kv/store", good, streamCT)
	if r.code != 413 || string(r.body) != `{"detail":"request body exceeds 2200 bytes"}` {
		t.Fatalf("streamed KV store over the limit: %d %s", r.code, r.body)
	}
	r = e.do("POST", "/api/kv/store", good, streamCT)
	if r.code != 413 || string(r.body) != `{"detail":"request body exceeds 2200 bytes"}` {
		t.Fatalf("declared KV store over the limit: %d %s", r.code, r.body)
	}
	const limit = 1 << 20
	body, ct := scriptForm(t, "script", strings.Repeat("#", limit+64<<10))
	for name, r := range map[string]resp{
		"streamed": streamed(t, e, "POST", "/run_script", body, map[string]string{"Content-Type": ct}),
		"declared": e.do("POST", "/run_script", body, map[string]string{"Content-Type": ct}),
	} {
		if r.code != 413 || string(r.body) != fmt.Sprintf("script exceeds %d bytes", limit) || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
			t.Errorf("%s script over the limit: %d %q (%s)", name, r.code, r.body, r.header.Get("Content-Type"))
		}
	}
}

// TestRunScriptBodyDeadline: /run_script's form is read within the body
// read deadline too; a stalled upload is 408 (text, the route's shape).
func TestRunScriptBodyDeadline(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.BodyReadTimeout = 200 * time.Millisecond; o.RunScriptEnabled = true }})
	c, err := net.Dial("tcp", strings.TrimPrefix(e.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "POST /run_script HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000\r\n\r\n--b\r\nContent-Disposition: form-data; name=\"script\"; filename=\"s.star\"\r\n\r\nresult")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	req, _ := http.NewRequest("POST", e.base+"/run_script", nil)
	record(req, res.StatusCode)
	if res.StatusCode != http.StatusRequestTimeout || string(b) != "request body not received within the read deadline" {
		t.Fatalf("stalled script upload: %d %q, want 408", res.StatusCode, b)
	}
}

// TestListObjectsDefaultPageSize: without page_size, GET /cache/objects
// pages by 500 (upstream's default): 501 objects come as a page of 500
// with a next_page_token and a page of 1 without one.
func TestListObjectsDefaultPageSize(t *testing.T) {
	// One fs adapter only: the harness's DAX adapter holds 16 objects,
	// so write-behind of 501 would never drain.
	fsA, _ := newFS(t)
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{fsA}})
	const n = 501
	for start := 0; start < n; start += 167 {
		e.store(tokens(start*testChunk, 167*testChunk), "", payload(167, byte(start)))
	}
	e.waitListed(n)
	first := e.expect(200, "GET", "/cache/objects", nil).json(t)
	ents, _ := first["entries"].([]any)
	tok, _ := first["next_page_token"].(string)
	if len(ents) != 500 || tok == "" {
		t.Fatalf("first default page: %d entries, next_page_token %v; want 500 and a token", len(ents), first["next_page_token"])
	}
	second := e.expect(200, "GET", "/cache/objects?page_token="+tok, nil).json(t)
	if ents, _ := second["entries"].([]any); len(ents) != 1 || second["next_page_token"] != nil {
		t.Fatalf("second default page: %d entries, next_page_token %v; want 1 and null", len(ents), second["next_page_token"])
	}
}

// lookupCount is lmcache_mp_lookup_duration_seconds' sample count.
func lookupCount(t *testing.T, s *httpapi.Server) uint64 {
	t.Helper()
	mfs, err := s.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lmcache_mp_lookup_duration_seconds" {
			continue
		}
		var n uint64
		for _, m := range mf.GetMetric() {
			n += histogram(m).GetSampleCount()
		}
		return n
	}
	t.Fatal("lmcache_mp_lookup_duration_seconds not registered")
	return 0
}

func histogram(m *dto.Metric) *dto.Histogram { return m.GetHistogram() }

// TestKVLookupObservesDuration: one POST /api/kv/lookup adds exactly one
// sample to lmcache_mp_lookup_duration_seconds.
func TestKVLookupObservesDuration(t *testing.T) {
	e := start(t, envOpts{})
	e.store(tokens(0, testChunk), "", payload(1, 3))
	before := lookupCount(t, e.srv)
	lk := e.expect(200, "POST", "/api/kv/lookup", map[string]any{"model_name": testModel, "tokens": tokSlice(0, testChunk)}, jsonCT).json(t)
	if lk["hit_chunks"] != float64(1) {
		t.Fatalf("lookup = %v", lk)
	}
	if after := lookupCount(t, e.srv); after != before+1 {
		t.Fatalf("lookup histogram count %d -> %d, want +1", before, after)
	}
}

// TestDrainTimeoutNamesPending: the write-behind drain of the harness
// fails the test on timeout, naming what was still pending (it used to
// return silently).
func TestDrainTimeoutNamesPending(t *testing.T) {
	pending := []string{"adapter 2: 3 pending, 1 in flight"}
	msg := polltest.FailureOf(t, func(tb testing.TB) {
		polltest.Until(pendingTB{tb, &pending}, time.Millisecond, "write-behind to drain", func() bool { return false })
	})
	if want := "timed out after 1ms waiting for write-behind to drain; still busy: adapter 2: 3 pending, 1 in flight"; msg != want {
		t.Fatalf("failure %q, want %q", msg, want)
	}
}

// TestUnknownFieldHandling pins how unknown JSON fields are treated
// without matching encoding/json's error text: ordinary request models
// ignore them (as upstream's), and DAX reconfigure, which forbids them,
// answers FastAPI's extra_forbidden item naming the field.
func TestUnknownFieldHandling(t *testing.T) {
	e := start(t, envOpts{})
	js := map[string]string{"Content-Type": "application/json"}
	if m := e.expect(200, "POST", "/cache/clear", `{"tier":"l1","surprise":1}`, js).json(t); m["status"] == nil {
		t.Fatalf("clear with an unknown field: %v", m)
	}
	r := e.expect(422, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax0.0","size":"1GiB","extra":1}`, js)
	if want := `{"detail":[{"loc":["body","extra"],"msg":"Extra inputs are not permitted","type":"extra_forbidden"}]}`; string(r.body) != want {
		t.Fatalf("DAX add with an unknown field: %s, want %s", r.body, want)
	}
}
