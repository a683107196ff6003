package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

func TestInfoRoutesBeforeEngine(t *testing.T) {
	e := start(t, envOpts{noEngine: true, mutate: func(o *httpapi.Options) { o.Config = nil }})
	if m := e.expect(200, "GET", "/", nil).json(t); m["status"] != "ok" || m["service"] != "LMCache HTTP API" {
		t.Fatalf("GET / = %v", m)
	}
	if m := e.expect(503, "GET", "/healthcheck", nil).json(t); m["status"] != "unhealthy" || m["reason"] != "engine not initialized" {
		t.Fatalf("healthcheck = %v", m)
	}
	if m := e.expect(503, "GET", "/status", nil).json(t); m["error"] != "engine not initialized" {
		t.Fatalf("status = %v", m)
	}
	if m := e.expect(503, "GET", "/config", nil).json(t); m["error"] != "configs not initialized" {
		t.Fatalf("config = %v", m)
	}
	if m := e.expect(503, "GET", "/config/adapters", nil).json(t); m["detail"] != "server not initialized" {
		t.Fatalf("config/adapters = %v", m)
	}
	// Every engine-backed route answers 503 with its own body shape.
	for _, c := range []struct{ method, path, field string }{
		{"GET", "/cache/objects", "detail"},
		{"GET", "/cache/prefetches/abc", "detail"},
		{"POST", "/cache/clear", "detail"},
		{"GET", "/quota", "error"},
		{"GET", "/quota/alice", "error"},
		{"DELETE", "/quota/alice", "error"},
		{"GET", "/reconfigure/dax/status", "error"},
	} {
		m := e.expect(503, c.method, c.path, nil).json(t)
		if _, ok := m[c.field].(string); !ok {
			t.Errorf("%s %s: 503 body %v lacks %q", c.method, c.path, m, c.field)
		}
	}
	e.expect(503, "DELETE", "/cache/objects", `{"keys":[]}`)
	e.expect(503, "POST", "/cache/prefetches", `{"model_name":"m","world_size":1,"token_ids":[]}`)
	e.expect(503, "POST", "/cache/checksums", `{"block_ids":[0],"chunk_size":1}`)
	e.expect(503, "PUT", "/quota/alice", `{"limit_gb":1}`)
	e.expect(503, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax0.0","size":"1GiB"}`)
	kv := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk)}
	e.expect(503, "POST", "/api/kv/store", payload(1, 1), kv)
	e.expect(503, "POST", "/api/kv/retrieve", nil, kv)
	e.expect(503, "POST", "/api/kv/lookup", nil, kv)
}

func TestInfoRoutes(t *testing.T) {
	e := start(t, envOpts{})
	if m := e.expect(200, "GET", "/healthcheck", nil).json(t); m["status"] != "healthy" {
		t.Fatalf("healthcheck = %v", m)
	}
	st := e.expect(200, "GET", "/status", nil).json(t)
	for _, k := range []string{"is_healthy", "engine_type", "chunk_size", "hash_algorithm", "active_sessions", "registered_gpu_ids", "cache_context_meta", "active_prefetch_jobs", "storage_manager"} {
		if _, ok := st[k]; !ok {
			t.Errorf("/status lacks %q: %v", k, st)
		}
	}
	if st["engine_type"] != "MPCacheServer" || st["chunk_size"] != float64(testChunk) || st["hash_algorithm"] != "blake3" {
		t.Errorf("/status engine fields = %v %v %v", st["engine_type"], st["chunk_size"], st["hash_algorithm"])
	}
	meta := st["cache_context_meta"].(map[string]any)["0"].(map[string]any)
	if meta["model_name"] != testModel || meta["world_size"] != float64(1) {
		t.Errorf("cache_context_meta = %v", meta)
	}
	if _, ok := st["storage_manager"].(map[string]any); !ok {
		t.Errorf("storage_manager = %T", st["storage_manager"])
	}

	cfg := e.expect(200, "GET", "/config", nil)
	if !strings.Contains(string(cfg.body), "\n  \"mp\"") {
		t.Errorf("/config is not indented: %s", cfg.body)
	}
	cm := cfg.json(t)
	for _, g := range []string{"mp", "storage_manager", "observability"} {
		if _, ok := cm[g].(map[string]any); !ok {
			t.Errorf("/config lacks group %q", g)
		}
	}
	if cm["mp"].(map[string]any)["chunk_size"] != float64(testChunk) {
		t.Errorf("/config mp = %v", cm["mp"])
	}

	ads := e.expect(200, "GET", "/config/adapters", nil).json(t)["adapters"].([]any)
	if len(ads) != 4 {
		t.Fatalf("adapters = %v", ads)
	}
	want := []struct {
		name           string
		primary, recfg bool
	}{{"fs", true, false}, {"nolist", false, false}, {"dax", false, true}, {"gen", false, true}}
	for i, w := range want {
		a := ads[i].(map[string]any)
		if a["index"] != float64(i) || a["type_name"] != w.name || a["tier"] != "l2" || a["primary"] != w.primary || a["reconfigurable"] != w.recfg {
			t.Errorf("adapter %d = %v", i, a)
		}
	}

	for path, want := range map[string]string{"/version": "0.3.1-ca79ea33", "/lmc_version": "0.3.1", "/commit_id": "ca79ea33"} {
		var s string
		if err := json.Unmarshal(e.expect(200, "GET", path, nil).body, &s); err != nil || s != want {
			t.Errorf("%s = %q (%v), want %q", path, s, err, want)
		}
	}
}

func TestVersionUnstamped(t *testing.T) {
	e := start(t, envOpts{noEngine: true, mutate: func(o *httpapi.Options) { o.Version, o.Commit = "", "" }})
	for path, want := range map[string]string{"/version": "NA-NA", "/lmc_version": "", "/commit_id": ""} {
		var s string
		if err := json.Unmarshal(e.expect(200, "GET", path, nil).body, &s); err != nil || s != want {
			t.Errorf("%s = %q (%v), want %q", path, s, err, want)
		}
	}
}

func TestNoL2Adapters(t *testing.T) {
	e := start(t, envOpts{noAdapters: true})
	if ads := e.expect(200, "GET", "/config/adapters", nil).json(t)["adapters"].([]any); len(ads) != 0 {
		t.Fatalf("adapters = %v", ads)
	}
	if m := e.expect(503, "GET", "/cache/objects", nil).json(t); m["detail"] != "no L2 adapters configured" {
		t.Fatalf("list = %v", m)
	}
	key := `{"keys":[{"chunk_hash_hex":"aa","model_name":"m","kv_rank":0}]}`
	if m := e.expect(503, "DELETE", "/cache/objects", key).json(t); m["detail"] != "no L2 adapters configured" {
		t.Fatalf("delete = %v", m)
	}
	// A pure L1 delete needs no adapter.
	if m := e.expect(200, "DELETE", "/cache/objects", `{"tier":"l1","keys":[{"chunk_hash_hex":"aa","model_name":"m","kv_rank":0}]}`).json(t); m["ok"] != true || m["adapter"] != nil {
		t.Fatalf("l1 delete = %v", m)
	}
}

func TestOpenAPIListsEveryRoute(t *testing.T) {
	e := start(t, envOpts{noEngine: true})
	var doc struct {
		OpenAPI string                               `json:"openapi"`
		Paths   map[string]map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(e.expect(200, "GET", "/openapi.json", nil).body, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi = %q", doc.OpenAPI)
	}
	routes := httpapi.Routes()
	if len(routes) < 33 {
		t.Fatalf("only %d routes", len(routes))
	}
	for _, r := range routes {
		op, ok := doc.Paths[r.Path][strings.ToLower(r.Method)]
		if !ok {
			t.Errorf("%s %s missing from /openapi.json", r.Method, r.Path)
			continue
		}
		resps := op["responses"].(map[string]any)
		if len(resps) != len(r.Statuses) {
			t.Errorf("%s %s: %d responses documented, route table has %d", r.Method, r.Path, len(resps), len(r.Statuses))
		}
	}
	// Every upstream route of the spec is in the table.
	for _, want := range []string{
		"GET /", "GET /healthcheck", "GET /status", "GET /config", "GET /config/adapters", "GET /version", "GET /lmc_version", "GET /commit_id",
		"GET /cache/objects", "DELETE /cache/objects", "POST /cache/prefetches", "GET /cache/prefetches/{request_id}", "POST /cache/clear", "POST /cache/checksums",
		"GET /quota", "PUT /quota/{cache_salt}", "GET /quota/{cache_salt}", "DELETE /quota/{cache_salt}",
		"GET /reconfigure/{backend}/status", "POST /reconfigure/{backend}/{operation}",
		"GET /metrics", "POST /metrics/reset", "GET /loglevel", "GET /threads", "GET /periodic-threads", "GET /periodic-threads/{thread_name}",
		"GET /periodic-threads-health", "GET /env", "POST /run_script",
		"POST /api/kv/store", "POST /api/kv/retrieve", "POST /api/kv/lookup", "GET /openapi.json",
	} {
		method, path, _ := strings.Cut(want, " ")
		if _, ok := doc.Paths[path][strings.ToLower(method)]; !ok {
			t.Errorf("%s missing", want)
		}
	}
	// Unknown paths are a JSON 404.
	if m := e.expect(404, "GET", "/nope", nil).json(t); m["detail"] != "Not Found" {
		t.Errorf("unknown path = %v", m)
	}
	r := e.expect(405, "PATCH", "/quota/alice", nil)
	if m := r.json(t); m["detail"] != "Method Not Allowed" || r.header.Get("Allow") != "GET, PUT, DELETE" {
		t.Errorf("wrong method = %v, Allow %q", m, r.header.Get("Allow"))
	}
	e.expect(405, "POST", "/status", nil)
}

// TestStatusModelLayoutsSurviveStatusExtra: the data path's StatusExtra
// replaces cache_context_meta with its workers' contexts (none here), and
// GET /status still lists the --register-model layout under model_layouts.
func TestStatusModelLayoutsSurviveStatusExtra(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.StatusExtra = func() httpapi.DataPathStatus {
			return httpapi.DataPathStatus{CacheContextMeta: map[string]httpapi.CacheContext{}}
		}
	}})
	st := e.expect(200, "GET", "/status", nil).json(t)
	if meta := st["cache_context_meta"].(map[string]any); len(meta) != 0 {
		t.Fatalf("cache_context_meta = %v, want StatusExtra's empty map", meta)
	}
	models, _ := st["model_layouts"].([]any)
	if len(models) != 1 {
		t.Fatalf("model_layouts = %v", st["model_layouts"])
	}
	want, err := httpapi.ParseRegisterModel(registerJSON, testChunk)
	if err != nil {
		t.Fatal(err)
	}
	m := models[0].(map[string]any)
	if m["model_name"] != testModel || m["world_size"] != 1.0 || m["object_bytes"] != float64(want.ObjectBytes) || want.ObjectBytes <= 0 || len(m) != 3 {
		t.Fatalf("model_layouts[0] = %v", m)
	}
}
