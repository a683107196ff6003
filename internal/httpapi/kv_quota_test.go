package httpapi_test

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

func TestKVStoreRetrieveLookup(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.MaxKVBodyBytes = 4 * objBytes }})
	h := func(toks string) map[string]string {
		return map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: toks, httpapi.HeaderCacheSalt: "t1"}
	}
	// Miss before anything is stored.
	r := e.expect(404, "POST", "/api/kv/retrieve", nil, h(tokens(0, 2*testChunk)))
	if r.header.Get(httpapi.HeaderHitChunks) != "0" || r.header.Get(httpapi.HeaderTotalChunks) != "2" {
		t.Fatalf("miss headers = %v", r.header)
	}
	data := payload(3, 5)
	if m := e.store(strings.ReplaceAll(tokens(0, 3*testChunk), ",", " "), "t1", data); m["stored"] != float64(3) || m["tokens"] != float64(3*testChunk) {
		t.Fatalf("store = %v", m)
	}
	// Storing again is idempotent (already resident keys are skipped).
	if m := e.store("["+tokens(0, 3*testChunk)+"]", "t1", data); m["stored"] != float64(0) || m["keys"] != float64(3) {
		t.Fatalf("restore = %v", m)
	}

	// The longest cached prefix comes back byte-exact, even when the
	// request asks for more chunks than are stored.
	r = e.expect(200, "POST", "/api/kv/retrieve", nil, h(tokens(0, 5*testChunk+1)))
	if !bytes.Equal(r.body, data) {
		t.Fatalf("retrieve returned %d bytes, want the 3 stored chunks (%d bytes)", len(r.body), len(data))
	}
	if r.header.Get(httpapi.HeaderHitChunks) != "3" || r.header.Get(httpapi.HeaderHitTokens) != "48" || r.header.Get(httpapi.HeaderTotalChunks) != "5" || r.header.Get(httpapi.HeaderL1Keys) != "3" {
		t.Fatalf("hit headers = %v", r.header)
	}
	// A different salt is a different key space.
	e.expect(404, "POST", "/api/kv/retrieve", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk)})

	m := e.expect(200, "POST", "/api/kv/lookup", nil, h(tokens(0, 4*testChunk))).json(t)
	if m["hit_chunks"] != float64(3) || m["hit_tokens"] != float64(48) || m["total_chunks"] != float64(4) || m["total_tokens"] != float64(64) {
		t.Fatalf("lookup = %v", m)
	}
	if m := e.expect(200, "POST", "/api/kv/lookup", nil, h(tokens(0, 3))).json(t); m["total_chunks"] != float64(0) || m["hit_chunks"] != float64(0) {
		t.Fatalf("sub-chunk lookup = %v", m)
	}

	// Validation.
	e.expect(400, "POST", "/api/kv/store", data, map[string]string{httpapi.HeaderTokens: tokens(0, testChunk)})
	e.expect(400, "POST", "/api/kv/store", data, h("1,x,3"))
	e.expect(400, "POST", "/api/kv/store", data, h("-1"))
	e.expect(400, "POST", "/api/kv/store", data, h(""))
	e.expect(400, "POST", "/api/kv/store", payload(1, 0), h(tokens(0, 2*testChunk)))
	e.expect(400, "POST", "/api/kv/store", payload(1, 0), map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk), httpapi.HeaderCacheSalt: "a@b"})
	e.expect(400, "POST", "/api/kv/store", payload(1, 0), map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk), httpapi.HeaderWorldSize: "zero"})
	e.expect(400, "POST", "/api/kv/retrieve", nil, h("nope"))
	e.expect(400, "POST", "/api/kv/lookup", nil, h("nope"))
	// An unregistered model (or world size) is upstream's 400 (409 before
	// upstream's statuses were adopted).
	for _, r := range []resp{
		e.expect(400, "POST", "/api/kv/store", payload(1, 0), map[string]string{httpapi.HeaderModel: "other", httpapi.HeaderTokens: tokens(0, testChunk)}),
		e.expect(400, "POST", "/api/kv/retrieve", nil, map[string]string{httpapi.HeaderModel: "other", httpapi.HeaderTokens: tokens(0, testChunk)}),
		e.expect(400, "POST", "/api/kv/lookup", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk), httpapi.HeaderWorldSize: "2"}),
	} {
		if d := r.json(t)["detail"]; !strings.Contains(d.(string), "is not registered with this engine") {
			t.Errorf("unregistered detail = %v", d)
		}
	}
	e.expect(413, "POST", "/api/kv/store", payload(5, 0), h(tokens(0, 5*testChunk)))
}

func TestQuota(t *testing.T) {
	e := start(t, envOpts{})
	if m := e.expect(200, "GET", "/quota", nil).json(t); len(m["users"].(map[string]any)) != 0 {
		t.Fatalf("empty list = %v", m)
	}
	if m := e.expect(200, "PUT", "/quota/alice", `{"limit_gb": 10.5}`).json(t); m["cache_salt"] != "alice" || m["limit_gb"] != 10.5 || m["status"] != "ok" {
		t.Fatalf("put = %v", m)
	}
	// Python float() semantics for numeric strings; booleans are refused
	// (TestQuotaStrictNumbers).
	e.expect(200, "PUT", "/quota/bob", `{"limit_gb": "2"}`)
	e.expect(200, "PUT", "/quota/_default", `{"limit_gb": 1}`)
	for body, msg := range map[string]string{
		`nope`:                 "invalid JSON body",
		`[1]`:                  "body must be {'limit_gb': <float>}",
		`{}`:                   "body must be {'limit_gb': <float>}",
		`{"limit_gb":"abc"}`:   "limit_gb must be numeric",
		`{"limit_gb":null}`:    "limit_gb must be numeric",
		`{"limit_gb":true}`:    "limit_gb must be numeric",
		`{"limit_gb":false}`:   "limit_gb must be numeric",
		`{"limit_gb":"nan"}`:   "limit_gb must be finite",
		`{"limit_gb":"-inf"}`:  "limit_gb must be finite",
		`{"limit_gb":1e400}`:   "limit_gb must be finite",
		`{"limit_gb":-0.5}`:    "limit_gb must be non-negative",
		`{"limit_gb":"1e999"}`: "limit_gb must be finite",
	} {
		if m := e.expect(400, "PUT", "/quota/carol", body).json(t); m["error"] != msg {
			t.Errorf("PUT %s: %v, want %q", body, m, msg)
		}
	}
	m := e.expect(200, "GET", "/quota/alice", nil).json(t)
	if m["cache_salt"] != "alice" || m["limit_gb"] != 10.5 || m["current_usage_gb"] != float64(0) || m["exists"] != true {
		t.Fatalf("get = %v", m)
	}
	if m := e.expect(200, "GET", "/quota/carol", nil).json(t); m["exists"] != false || m["limit_gb"] != float64(0) {
		t.Fatalf("unknown salt = %v", m)
	}
	users := e.expect(200, "GET", "/quota", nil).json(t)["users"].(map[string]any)
	if len(users) != 3 || users["_default"].(map[string]any)["limit_gb"] != float64(1) || users["bob"].(map[string]any)["limit_gb"] != float64(2) {
		t.Fatalf("list = %v", users)
	}
	if m := e.expect(200, "GET", "/quota/_default", nil).json(t); m["cache_salt"] != "_default" || m["exists"] != true {
		t.Fatalf("_default = %v", m)
	}
	if m := e.expect(200, "DELETE", "/quota/alice", nil).json(t); m["status"] != "removed" {
		t.Fatalf("delete = %v", m)
	}
	if m := e.expect(200, "DELETE", "/quota/alice", nil).json(t); m["status"] != "not_found" || m["cache_salt"] != "alice" {
		t.Fatalf("delete again = %v", m)
	}
	// Usage is L2 bytes per salt: store one chunk under salt "bob".
	e.store(tokens(0, testChunk), "bob", payload(1, 1))
	waitFor(t, "bob's L2 usage", func() bool {
		m := e.expect(200, "GET", "/quota/bob", nil).json(t)
		u := m["current_usage_gb"].(float64)
		return u > 0 && math.Abs(u*(1<<30)-float64(objBytes)*4) < 1 // four adapters store the chunk
	})
}

func TestReconfigure(t *testing.T) {
	e := start(t, envOpts{})
	m := e.expect(200, "GET", "/reconfigure/DAX%20/status", nil).json(t)
	ads := m["adapters"].([]any)
	if m["enabled"] != true || m["backend"] != "dax" || m["num_adapters"] != float64(1) || len(ads) != 1 {
		t.Fatalf("dax status = %v", m)
	}
	a0 := ads[0].(map[string]any)
	devs := a0["status"].(map[string]any)["devices"].([]any)
	if a0["adapter_index"] != float64(0) || a0["backend"] != "dax" || len(devs) != 1 || devs[0].(map[string]any)["state"] != "active" {
		t.Fatalf("dax adapter status = %v", a0)
	}
	if m := e.expect(200, "GET", "/reconfigure/s3/status", nil).json(t); m["enabled"] != false || m["num_adapters"] != float64(0) || len(m["adapters"].([]any)) != 0 {
		t.Fatalf("unknown backend = %v", m)
	}
	if m := e.expect(400, "GET", "/reconfigure/%20/status", nil).json(t); m["error"] != "backend must be non-empty" {
		t.Fatalf("empty backend = %v", m)
	}

	// Real DAX adapter over files: add, conflicting re-add, resize, drain, remove.
	dev1 := filepath.Join(e.daxDir, "dax1")
	if err := os.WriteFile(dev1, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m = e.expect(200, "POST", "/reconfigure/dax/add", map[string]any{"device_path": dev1, "size": "8KiB"}).json(t)
	if m["status"] != "ok" || m["operation"] != "add" || m["adapter_index"] != float64(0) || m["device"].(map[string]any)["state"] != "active" {
		t.Fatalf("add = %v", m)
	}
	if m := e.expect(409, "POST", "/reconfigure/dax/add", map[string]any{"device_path": dev1, "size": "16k"}).json(t); !strings.Contains(m["error"].(string), "already mapped") {
		t.Fatalf("conflicting add = %v", m)
	}
	m = e.expect(200, "POST", "/reconfigure/dax/resize", map[string]any{"device_path": dev1, "size": 16 * objBytes}).json(t)
	if m["operation"] != "resize" || m["old_size_bytes"] != float64(8*objBytes) || m["new_size_bytes"] != float64(16*objBytes) {
		t.Fatalf("resize = %v", m)
	}
	if m := e.expect(200, "POST", "/reconfigure/dax/remove", map[string]any{"device_path": dev1, "mode": "drain"}).json(t); m["state"] != "draining" {
		t.Fatalf("drain = %v", m)
	}
	if m := e.expect(200, "POST", "/reconfigure/dax/remove", map[string]any{"device_path": dev1, "mode": "evict"}).json(t); m["state"] != "removed" {
		t.Fatalf("remove = %v", m)
	}
	e.expect(404, "POST", "/reconfigure/dax/remove", map[string]any{"device_path": "/nonexistent/dax9"})
	if m := e.expect(400, "POST", "/reconfigure/dax/add", map[string]any{"device_path": dev1, "size": "100b"}).json(t); !strings.Contains(m["error"].(string), "cannot hold one slot") {
		t.Fatalf("sub-slot add = %v", m)
	}
	if m := e.expect(400, "POST", "/reconfigure/dax/explode", `{}`).json(t); m["error"] != "unsupported dax reconfigure operation: explode" {
		t.Fatalf("bad op = %v", m)
	}
	for _, size := range []string{`"0"`, `"-1GiB"`, `"10 PB"`, `"1.GiB"`, `0`, `-5`, `""`} {
		if m := e.expect(400, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax0.0","size":`+size+`}`).json(t); !strings.HasPrefix(m["error"].(string), "size must be a positive integer") {
			t.Errorf("size %s: %v", size, m)
		}
	}
	e.expect(422, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax0.0","size":"1GiB","extra":1}`)
	e.expect(422, "POST", "/reconfigure/dax/add", `{"size":"1GiB"}`)
	e.expect(422, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax0.0","size":true}`)
	e.expect(422, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax0.0","size":1.5}`)
	e.expect(422, "POST", "/reconfigure/dax/resize", `{"device_path":"/dev/dax0.0","size":"1g","mode":"drain"}`)
	if m := e.expect(404, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax0.0","size":"1GiB","adapter_index":1}`).json(t); m["error"] != "dax adapter not found" {
		t.Fatalf("index = %v", m)
	}
	e.expect(404, "POST", "/reconfigure/fs/whatever", `{}`)
	e.expect(400, "POST", "/reconfigure/dax/%20", `{}`)

	// Generic backends go through the engine's Reconfigurer pass-through
	// with the body forwarded verbatim (adapter_index removed).
	m = e.expect(200, "POST", "/reconfigure/gen/flush", `{"adapter_index":0,"depth":3,"tags":["a"]}`).json(t)
	if args := m["args"].(map[string]any); m["operation"] != "flush" || args["depth"] != float64(3) || args["adapter_index"] != nil {
		t.Fatalf("generic = %v", m)
	}
	if c := e.gen.lastCall(); c["op"] != "flush" {
		t.Fatalf("adapter saw %v", c)
	}
	if m := e.expect(409, "POST", "/reconfigure/gen/remove", `{"device_path":"/dev/busy"}`).json(t); !strings.Contains(m["error"].(string), "locked slots") {
		t.Fatalf("adapter status = %v", m)
	}
	if m := e.expect(200, "GET", "/reconfigure/gen/status", nil).json(t); m["num_adapters"] != float64(1) {
		t.Fatalf("gen status = %v", m)
	}
}

// TestKVWorldSizeTwo stores and retrieves a TP=2 layout: every chunk has
// one object per rank, in rank order.
func TestKVWorldSizeTwo(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		l, err := httpapi.ParseRegisterModel(`{"model_name":"org/model","world_size":2,"num_layers":2,"hidden_size":8,"dtype":"bf16"}`, testChunk)
		if err != nil {
			t.Fatal(err)
		}
		if l.ObjectBytes != objBytes/2 {
			t.Fatalf("TP=2 object is %d bytes, want %d", l.ObjectBytes, objBytes/2)
		}
		o.RegisteredModels = append(o.RegisteredModels, l)
	}})
	h := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, 2*testChunk), httpapi.HeaderWorldSize: "2"}
	data := payload(2, 7) // 2 chunks x 2 ranks x 512 bytes
	if m := e.expect(200, "POST", "/api/kv/store", data, h).json(t); m["keys"] != float64(4) || m["stored"] != float64(4) {
		t.Fatalf("store = %v", m)
	}
	r := e.expect(200, "POST", "/api/kv/retrieve", nil, h)
	if !bytes.Equal(r.body, data) || r.header.Get(httpapi.HeaderL1Keys) != "4" {
		t.Fatalf("retrieve: %d bytes, headers %v", len(r.body), r.header)
	}
	// The TP=1 layout of the same model is a different key space.
	e.expect(404, "POST", "/api/kv/retrieve", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, 2*testChunk)})
	m := e.expect(202, "POST", "/cache/prefetches", map[string]any{"model_name": testModel, "world_size": 2, "token_ids": tokSlice(0, 2*testChunk)}).json(t)
	id := m["request_id"].(string)
	var done map[string]any
	waitFor(t, "prefetch", func() bool {
		done = e.expect(200, "GET", "/cache/prefetches/"+id, nil).json(t)
		return done["status"] == "completed"
	})
	if done["total_keys"] != float64(4) {
		t.Fatalf("completed = %v", done)
	}
}

// TestQuotaStrictNumbers: a boolean limit_gb is a 400 (upstream's float(True)
// stores 1 GB) and nothing is stored; -0.0 is stored and echoed as 0, the
// same rendering every other zero gets.
func TestQuotaStrictNumbers(t *testing.T) {
	e := start(t, envOpts{})
	if m := e.expect(400, "PUT", "/quota/dave", `{"limit_gb": true}`).json(t); m["error"] != "limit_gb must be numeric" {
		t.Fatalf("bool limit = %v", m)
	}
	if m := e.expect(200, "GET", "/quota/dave", nil).json(t); m["exists"] != false {
		t.Fatalf("a refused PUT stored a quota: %v", m)
	}
	for _, body := range []string{`{"limit_gb": -0.0}`, `{"limit_gb": "-0"}`, `{"limit_gb": -0}`} {
		r := e.expect(200, "PUT", "/quota/dave", body)
		if got := strings.TrimSpace(string(r.body)); got != `{"cache_salt":"dave","limit_gb":0,"status":"ok"}` {
			t.Fatalf("PUT %s echoed %s", body, got)
		}
		if got := strings.TrimSpace(string(e.expect(200, "GET", "/quota/dave", nil).body)); got != `{"cache_salt":"dave","current_usage_gb":0,"exists":true,"limit_gb":0}` {
			t.Fatalf("GET after %s = %s", body, got)
		}
	}
}
