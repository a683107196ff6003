package httpapi_test

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/polltest"
	"github.com/lmcache-go/lmcache/internal/quota"
)

// TestHealthcheckWaitsForRun: an engine that is wired (SetEngine) but
// whose Run has not started yet is still unhealthy; once Run is active the
// same server answers healthy.
func TestHealthcheckWaitsForRun(t *testing.T) {
	fsA, _ := newFS(t)
	eng, err := engine.New(engine.Config{L1SizeBytes: 16 << 20, L2: make([]engine.AdapterConfig, 1)}, []l2.Adapter{fsA}, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.New(httpapi.Options{Logger: quietLogger(), ChunkSize: testChunk, Version: "0.3.1", Commit: "ca79ea33"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.SetEngine(eng); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ctx, ln); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	tr := &http.Transport{}
	e := &env{t: t, base: "http://" + ln.Addr().String(), hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	engDone := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		<-engDone
		tr.CloseIdleConnections()
		if err := eng.CloseChecked(); err != nil {
			t.Error(err)
		}
	})

	if eng.Ready() {
		t.Fatal("engine Ready before Run")
	}
	r := e.expect(503, "GET", "/healthcheck", nil)
	if m := r.json(t); m["status"] != "unhealthy" || m["reason"] != "engine not initialized" || len(m) != 2 {
		t.Fatalf("before Run = %v", m)
	}
	go func() { defer close(engDone); _ = eng.Run(ctx) }()
	polltest.Until(t, 10*time.Second, "healthcheck to turn healthy", func() bool {
		return e.do("GET", "/healthcheck", nil, nil).code == 200
	})
	if m := e.expect(200, "GET", "/healthcheck", nil).json(t); m["status"] != "healthy" || len(m) != 1 {
		t.Fatalf("after Run = %v", m)
	}
}

// TestConfigKeepsNonASCII: /config is indented by 2 and writes non-ASCII
// characters as themselves (Python's ensure_ascii=False), not \u escapes.
func TestConfigKeepsNonASCII(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.Config["mp"]["instance_label"] = "café-東京 ✓"
	}})
	r := e.expect(200, "GET", "/config", nil)
	if !strings.Contains(string(r.body), `"instance_label": "café-東京 ✓"`) {
		t.Fatalf("non-ASCII not kept verbatim: %s", r.body)
	}
	if strings.Contains(string(r.body), `\u`) {
		t.Fatalf("body has \\u escapes: %s", r.body)
	}
	if !strings.Contains(string(r.body), "{\n  \"mp\": {\n    ") {
		t.Fatalf("not indented by 2: %s", r.body)
	}
	if got := r.json(t)["mp"].(map[string]any)["instance_label"]; got != "café-東京 ✓" {
		t.Fatalf("instance_label = %v", got)
	}
}

func encKey(k objkey.Key) map[string]any {
	return map[string]any{"chunk_hash_hex": k.HashHex(), "model_name": k.ModelName, "kv_rank": k.KVRank, "object_group_id": k.ObjectGroupID, "cache_salt": k.CacheSalt}
}

// TestAdaptersSharedAndFirstMatch: two fs adapters, the second configured
// shared. /config/adapters reports `shared` per adapter; GET /cache/objects
// with adapter=fs picks the first match (index 0, not shared) and reports
// its `shared`; tier=all is 400 like tier=l1.
func TestAdaptersSharedAndFirstMatch(t *testing.T) {
	a0, _ := newFS(t)
	a1, _ := newFS(t)
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{a0, a1}, shared: []int{1}})
	ads := e.expect(200, "GET", "/config/adapters", nil).json(t)["adapters"].([]any)
	if len(ads) != 2 {
		t.Fatalf("adapters = %v", ads)
	}
	for i, want := range []bool{false, true} {
		a := ads[i].(map[string]any)
		if a["index"] != float64(i) || a["type_name"] != "fs" || a["shared"] != want {
			t.Fatalf("adapter %d = %v, want shared %v", i, a, want)
		}
	}
	e.store(tokens(0, testChunk), "", payload(1, 5))
	e.waitListed(1)
	m := e.expect(200, "GET", "/cache/objects?adapter=fs", nil).json(t)
	if m["adapter"] != "fs" || m["shared"] != false || len(m["entries"].([]any)) != 1 {
		t.Fatalf("adapter=fs (first match, index 0) = %v", m)
	}
	if m := e.expect(400, "GET", "/cache/objects?tier=all", nil).json(t); m["detail"] != "tier 'all' not supported; only 'l2'" {
		t.Fatalf("tier all = %v", m)
	}
}

// TestAdaptersSharedPrimary: a shared primary adapter is reported shared
// by GET /cache/objects.
func TestAdaptersSharedPrimary(t *testing.T) {
	a0, _ := newFS(t)
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{a0}, shared: []int{0}})
	if m := e.expect(200, "GET", "/cache/objects", nil).json(t); m["adapter"] != "fs" || m["shared"] != true {
		t.Fatalf("listing = %v", m)
	}
	if a := e.expect(200, "GET", "/config/adapters", nil).json(t)["adapters"].([]any)[0].(map[string]any); a["shared"] != true {
		t.Fatalf("adapter = %v", a)
	}
}

// TestDeleteObjectsL1Tiers: tier l1 removes the L1 copy only (adapter
// null, L2 untouched); tier all removes it from L1 and the adapter, and
// `deleted` counts both; `skipped` is 0 when nothing is locked.
func TestDeleteObjectsL1Tiers(t *testing.T) {
	a0, _ := newFS(t)
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{a0}})
	lookup := func(start int) map[string]any {
		return e.expect(200, "POST", "/api/kv/lookup", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(start, testChunk)}).json(t)
	}
	e.store(tokens(0, testChunk), "", payload(1, 1))
	e.store(tokens(500, testChunk), "", payload(1, 2))
	e.waitListed(2)
	if l := lookup(0); l["l1_keys"] != float64(1) {
		t.Fatalf("lookup before = %v", l)
	}
	k0 := keysFor(t, tokSlice(0, testChunk), "")[0]
	m := e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": []any{encKey(k0)}, "tier": "l1"}).json(t)
	if m["requested"] != float64(1) || m["adapter"] != nil || m["ok"] != true || m["deleted"] != float64(1) || m["skipped"] != float64(0) {
		t.Fatalf("tier l1 delete = %v", m)
	}
	if l := lookup(0); l["l1_keys"] != float64(0) || l["l2_keys"] != float64(1) {
		t.Fatalf("after tier l1 delete: %v (want L1 gone, L2 kept)", l)
	}
	e.waitListed(2)

	k1 := keysFor(t, tokSlice(500, testChunk), "")[0]
	if l := lookup(500); l["l1_keys"] != float64(1) {
		t.Fatalf("lookup before tier all = %v", l)
	}
	m = e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": []any{encKey(k1)}, "tier": "all"}).json(t)
	if m["requested"] != float64(1) || m["adapter"] != "fs" || m["ok"] != true || m["deleted"] != float64(2) || m["skipped"] != float64(0) {
		t.Fatalf("tier all delete = %v", m)
	}
	if l := lookup(500); l["l1_keys"] != float64(0) || l["l2_keys"] != float64(0) || l["hit_chunks"] != float64(0) {
		t.Fatalf("after tier all delete: %v", l)
	}
	e.waitListed(1)
}

// TestClearTierAllAndForce: tier all is 400 (only l1 clears), and force
// true is accepted and changes nothing: L1 is emptied as without it.
func TestClearTierAllAndForce(t *testing.T) {
	e := start(t, envOpts{})
	if m := e.expect(400, "POST", "/cache/clear", `{"tier":"all"}`).json(t); m["detail"] != "tier 'all' not supported; only 'l1'" {
		t.Fatalf("tier all = %v", m)
	}
	e.store(tokens(0, testChunk), "", payload(1, 3))
	kv := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk)}
	if r := e.expect(200, "POST", "/api/kv/lookup", nil, kv).json(t); r["l1_keys"] != float64(1) {
		t.Fatalf("lookup = %v", r)
	}
	m := e.expect(200, "POST", "/cache/clear", `{"tier":"l1","force":true}`).json(t)
	if m["status"] != "ok" || m["cleared"].(map[string]any)["tier"] != "l1" || len(m) != 2 {
		t.Fatalf("clear force = %v", m)
	}
	if r := e.expect(200, "POST", "/api/kv/lookup", nil, kv).json(t); r["l1_keys"] != float64(0) {
		t.Fatalf("lookup after clear = %v", r)
	}
}

// TestKVUpstreamStoreOurFields: upstream's store form also answers our
// chunks, tokens, keys and stored: whole chunks, their tokens, one key per
// (chunk, rank), and the objects newly written (0 on a repeat).
func TestKVUpstreamStoreOurFields(t *testing.T) {
	e := startKV(t)
	const n = 3
	toks := tokens(7000, n*testChunk+5)
	st := e.expect(200, "POST", "/api/kv/store", kvTP2.tensor(n, 9), upstreamStore(kvTP2.name, toks, "")).json(t)
	wantJSON(t, "store", st, map[string]any{"chunks": float64(n), "tokens": float64(n * testChunk), "keys": float64(n * 2), "stored": float64(n * 2)})
	again := e.expect(200, "POST", "/api/kv/store", kvTP2.tensor(n, 9), upstreamStore(kvTP2.name, toks, "")).json(t)
	wantJSON(t, "repeat store", again, map[string]any{"chunks": float64(n), "tokens": float64(n * testChunk), "keys": float64(n * 2), "stored": float64(0)})
}

// TestKVRawRetrieveForm: the X-LMCache-Model form answers the raw objects
// as application/octet-stream, a miss as 404 with a JSON detail, and the
// -L1-Keys/-L2-Keys headers count where the keys were found (L2 after L1
// was cleared).
func TestKVRawRetrieveForm(t *testing.T) {
	a0, _ := newFS(t)
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{a0}})
	data := payload(2, 4)
	e.store(tokens(0, 2*testChunk), "", data)
	e.waitListed(2)
	hdr := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, 2*testChunk)}
	r := e.expect(200, "POST", "/api/kv/retrieve", nil, hdr)
	if ct := r.header.Get("Content-Type"); ct != "application/octet-stream" {
		t.Fatalf("Content-Type = %q", ct)
	}
	if string(r.body) != string(data) {
		t.Fatalf("retrieve: %d bytes, not the %d stored", len(r.body), len(data))
	}
	if r.header.Get(httpapi.HeaderL1Keys) != "2" || r.header.Get(httpapi.HeaderL2Keys) != "0" {
		t.Fatalf("L1 hit headers: L1 %q L2 %q", r.header.Get(httpapi.HeaderL1Keys), r.header.Get(httpapi.HeaderL2Keys))
	}
	e.expect(200, "POST", "/cache/clear", `{"tier":"l1"}`)
	r = e.expect(200, "POST", "/api/kv/retrieve", nil, hdr)
	if string(r.body) != string(data) {
		t.Fatalf("retrieve from L2: %d bytes", len(r.body))
	}
	if r.header.Get(httpapi.HeaderL1Keys) != "0" || r.header.Get(httpapi.HeaderL2Keys) != "2" {
		t.Fatalf("L2 hit headers: L1 %q L2 %q", r.header.Get(httpapi.HeaderL1Keys), r.header.Get(httpapi.HeaderL2Keys))
	}
	miss := e.expect(404, "POST", "/api/kv/retrieve", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(90000, testChunk)})
	if ct := miss.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("miss Content-Type = %q", ct)
	}
	if m := miss.json(t); m["detail"] != "no cached prefix for these tokens" || len(m) != 1 {
		t.Fatalf("miss = %v", m)
	}
	if miss.header.Get(httpapi.HeaderL2Keys) != "0" {
		t.Fatalf("miss L2 header = %q", miss.header.Get(httpapi.HeaderL2Keys))
	}
}

// TestQuotaBytesAndDefaultSalt: PUT stores int(limit_gb * 2^30) bytes in
// the engine (fractions truncated), and an empty salt set on the engine is
// listed as _default.
func TestQuotaBytesAndDefaultSalt(t *testing.T) {
	e := start(t, envOpts{})
	for body, want := range map[string]int64{
		`{"limit_gb": 1.5}`:           1610612736,
		`{"limit_gb": "0.000000001"}`: 1, // 1.073741824 bytes
		`{"limit_gb": 2}`:             2147483648,
	} {
		e.expect(200, "PUT", "/quota/alice", body)
		got, ok := e.eng.Quota(quota.FromPath("alice"))
		if !ok || got != want {
			t.Errorf("PUT %s: engine limit %d (set %v), want %d", body, got, ok, want)
		}
	}
	if err := e.eng.SetQuota("", 3<<30); err != nil {
		t.Fatal(err)
	}
	users := e.expect(200, "GET", "/quota", nil).json(t)["users"].(map[string]any)
	d, ok := users["_default"].(map[string]any)
	if !ok || d["limit_gb"] != float64(3) || len(users) != 2 {
		t.Fatalf("users = %v", users)
	}
	if _, ok := users[""]; ok {
		t.Fatalf("empty salt listed verbatim: %v", users)
	}
}

// daxFake is a Reconfigurer named "dax" that records the arguments the
// DAX request decoding hands it.
type daxFake struct{ *genFake }

func (daxFake) TypeName() string { return "dax" }

// TestReconfigureDAXArgs: the DAX body is decoded into the adapter's
// arguments device_path, size_bytes (parsed), mode and force.
func TestReconfigureDAXArgs(t *testing.T) {
	gf, _ := newFS(t)
	d := daxFake{&genFake{Adapter: gf}}
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{d}})
	e.expect(200, "POST", "/reconfigure/dax/resize", `{"device_path":"/dev/dax0.0","size":"2GiB","mode":"evict","force":true}`)
	c := d.lastCall()
	if len(c) != 5 || c["op"] != "resize" || c["device_path"] != "/dev/dax0.0" || c["mode"] != "evict" || c["force"] != true || toInt(c["size_bytes"]) != 2<<30 {
		t.Fatalf("resize args = %#v", c)
	}
	e.expect(200, "POST", "/reconfigure/dax/add", `{"device_path":"/dev/dax1.0","size":4096}`)
	c = d.lastCall()
	if len(c) != 3 || c["op"] != "add" || c["device_path"] != "/dev/dax1.0" || toInt(c["size_bytes"]) != 4096 {
		t.Fatalf("add args = %#v", c)
	}
	e.expect(200, "POST", "/reconfigure/dax/remove", `{"device_path":"/dev/dax1.0","mode":"drain"}`)
	c = d.lastCall()
	if c["op"] != "remove" || c["device_path"] != "/dev/dax1.0" || c["mode"] != "drain" || c["force"] != false {
		t.Fatalf("remove args = %#v", c)
	}
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case uint64:
		return int64(n)
	case float64:
		return int64(n)
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	return -1
}

// TestDeleteObjectsSkipsLockedUnlessForced: a chunk read-locked by a
// lookup's prefetch job (one reader, as a LOOKUP with a pending retrieve
// holds it) survives DELETE /cache/objects tier l1 without force
// (deleted 0, skipped 1, still an L1 hit) and goes with force true
// (deleted 1, skipped 0); the job's lock is still found and released
// afterwards, so no read lease is left at Engine.Close.
func TestDeleteObjectsSkipsLockedUnlessForced(t *testing.T) {
	a0, _ := newFS(t)
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{a0}})
	e.store(tokens(0, testChunk), "", payload(1, 1))
	e.waitListed(1)
	k := keysFor(t, tokSlice(0, testChunk), "")[0]
	if err := e.eng.Prefetch(engine.PrefetchRequest{ID: "locked-req", Chunks: [][]objkey.Key{{k}}, Readers: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := e.eng.WaitPrefetch(ctx, "locked-req")
	if err != nil || res.PrefixChunks != 1 {
		t.Fatalf("prefetch = %+v, %v; want the chunk locked as a 1-chunk prefix", res, err)
	}
	l1Keys := func() any {
		return e.expect(200, "POST", "/api/kv/lookup", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk)}).json(t)["l1_keys"]
	}

	m := e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": []any{encKey(k)}, "tier": "l1"}).json(t)
	if m["requested"] != float64(1) || m["ok"] != true || m["deleted"] != float64(0) || m["skipped"] != float64(1) {
		t.Fatalf("unforced delete of a locked key = %v, want deleted 0, skipped 1", m)
	}
	if n := l1Keys(); n != float64(1) {
		t.Fatalf("l1_keys after the skipped delete = %v, want 1", n)
	}
	m = e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": []any{encKey(k)}, "tier": "l1", "force": true}).json(t)
	if m["deleted"] != float64(1) || m["skipped"] != float64(0) {
		t.Fatalf("forced delete of a locked key = %v, want deleted 1, skipped 0", m)
	}
	if n := l1Keys(); n != float64(0) {
		t.Fatalf("l1_keys after the forced delete = %v, want 0", n)
	}
	if n := e.eng.ReleaseRead("locked-req", []objkey.Key{k}, 1); n != 1 {
		t.Fatalf("released %d locks of the deleted key, want 1", n)
	}
}
