package httpapi_test

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// kvModel is a registered layout of these tests, described the way
// upstream's client sees it: a KV_2LTD tensor [2, layers, tokens,
// hidden] (MLA: [layers, tokens, latent]) of elem-byte elements, where
// hidden is the width over all ranks.
type kvModel struct {
	name          string
	world, layers int
	hidden, elem  int
	mla           bool
}

// The upstream-shaped fixtures: testModel is the harness's one-rank model
// (2 layers, hidden 8, bf16); tp2 splits hidden 16 over two ranks; mla
// keeps the 8-wide latent whole on each of two ranks.
var (
	kvOne = kvModel{name: testModel, world: 1, layers: 2, hidden: 8, elem: 2}
	kvTP2 = kvModel{name: "org/tp2", world: 2, layers: 2, hidden: 16, elem: 2}
	kvMLA = kvModel{name: "org/mla", world: 2, layers: 2, hidden: 8, elem: 2, mla: true}
)

func (m kvModel) register() string {
	return `{"model_name":"` + m.name + `","world_size":` + strconv.Itoa(m.world) + `,"num_layers":` + strconv.Itoa(m.layers) +
		`,"hidden_size":` + strconv.Itoa(m.hidden) + `,"dtype":"bfloat16","is_mla":` + strconv.FormatBool(m.mla) + `}`
}

// planes is the product of the dims before the token dim.
func (m kvModel) planes() int {
	if m.mla {
		return m.layers
	}
	return 2 * m.layers
}

// tensor is a random KV_2LTD payload of n chunks.
func (m kvModel) tensor(n int, seed uint64) []byte {
	b := make([]byte, m.planes()*n*testChunk*m.hidden*m.elem)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// object is what rank r's L1 object of chunk c must hold, written from the
// 4-D index of each element: element [kv, layer, t, d] of the rank's
// [2, layers, chunk, hidden/world] object is element [kv, layer, c*chunk+t,
// r*hidden/world+d] of the tensor (MLA: [layer, t, d] of [layer,
// c*chunk+t, d], the same on every rank).
func (m kvModel) object(tensor []byte, n, c, r int) []byte {
	tokens := n * testChunk
	per, off := m.hidden/m.world, r*(m.hidden/m.world)
	if m.mla {
		per, off = m.hidden, 0
	}
	var out []byte
	for kv := 0; kv < 2; kv++ {
		if m.mla && kv == 1 {
			break
		}
		for layer := 0; layer < m.layers; layer++ {
			plane := kv*m.layers + layer
			for t := 0; t < testChunk; t++ {
				for d := 0; d < per; d++ {
					el := (plane*tokens+c*testChunk+t)*m.hidden + off + d
					out = append(out, tensor[el*m.elem:(el+1)*m.elem]...)
				}
			}
		}
	}
	return out
}

// startKV starts the harness with the tp2 and MLA models registered too.
func startKV(t *testing.T, extra ...string) *env {
	t.Helper()
	return start(t, envOpts{mutate: func(o *httpapi.Options) {
		for _, js := range append([]string{kvTP2.register(), kvMLA.register()}, extra...) {
			l, err := httpapi.ParseRegisterModel(js, testChunk)
			if err != nil {
				t.Fatal(err)
			}
			o.RegisteredModels = append(o.RegisteredModels, l)
		}
	}})
}

// upstreamStore is the request upstream's client sends to /api/kv/store.
func upstreamStore(model, toks, salt string) map[string]string {
	return map[string]string{httpapi.HeaderModelName: model, httpapi.HeaderTokens: toks, httpapi.HeaderCacheSalt: salt,
		"Content-Type": "application/x-lmcache-kv; v=1"}
}

var jsonCT = map[string]string{"Content-Type": "application/json"}

func wantHeaders(t *testing.T, r resp, hitTok, hitCh, totTok, totCh int) {
	t.Helper()
	for h, v := range map[string]int{httpapi.HeaderHitTokens: hitTok, httpapi.HeaderHitChunks: hitCh, httpapi.HeaderTotalTokens: totTok, httpapi.HeaderTotalChunks: totCh} {
		if got := r.header.Get(h); got != strconv.Itoa(v) {
			t.Errorf("%s = %q, want %d", h, got, v)
		}
	}
}

func wantJSON(t *testing.T, what string, got map[string]any, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %v, want %v (all: %v)", what, k, got[k], v, got)
		}
	}
}

// TestKVUpstreamRoundTrip: a KV_2LTD tensor stored in upstream's form
// (X-LMCache-Model-Name, comma-separated tokens with a partial tail) comes
// back byte-exact from /api/kv/retrieve with upstream's media type and
// headers, for one rank, two ranks and MLA on two ranks; lookup reports
// upstream's counts; and each L1 object (read back through our raw-object
// form, which hands out exactly what the engine-driven ZMQ path's slots
// hold) is the slice of the tensor computed here from the 4-D indices.
func TestKVUpstreamRoundTrip(t *testing.T) {
	e := startKV(t)
	for i, m := range []kvModel{kvOne, kvTP2, kvMLA} {
		func() {
			const n = 3
			start := 1000 * (i + 1)
			toks := tokens(start, n*testChunk+3)
			tensor := m.tensor(n, uint64(i))
			st := e.expect(200, "POST", "/api/kv/store", tensor, upstreamStore(m.name, toks, "")).json(t)
			wantJSON(t, "store", st, map[string]any{"status": "ok", "total_tokens": float64(n * testChunk), "total_chunks": float64(n),
				"stored_tokens": float64(n * testChunk), "stored_chunks": float64(n)})

			r := e.expect(200, "POST", "/api/kv/retrieve", map[string]any{"model_name": m.name, "tokens": tokSlice(start, n*testChunk+3)}, jsonCT)
			if !bytes.Equal(r.body, tensor) {
				t.Fatalf("%s retrieve: %d bytes, not the %d stored", m.name, len(r.body), len(tensor))
			}
			if ct := r.header.Get("Content-Type"); ct != httpapi.ContentTypeKV {
				t.Errorf("Content-Type = %q", ct)
			}
			wantHeaders(t, r, n*testChunk, n, n*testChunk, n)
			// Upstream's header form of a read answers the same tensor.
			if r := e.expect(200, "POST", "/api/kv/retrieve", nil, map[string]string{httpapi.HeaderModelName: m.name, httpapi.HeaderTokens: toks}); !bytes.Equal(r.body, tensor) {
				t.Fatalf("header-form retrieve differs")
			}

			lk := e.expect(200, "POST", "/api/kv/lookup", map[string]any{"model_name": m.name, "tokens": tokSlice(start, n*testChunk+3), "cache_salt": ""}, jsonCT).json(t)
			wantJSON(t, "lookup", lk, map[string]any{"total_tokens": float64(n * testChunk), "total_chunks": float64(n), "hit_tokens": float64(n * testChunk), "hit_chunks": float64(n)})

			raw := e.expect(200, "POST", "/api/kv/retrieve", nil, map[string]string{httpapi.HeaderModel: m.name, httpapi.HeaderTokens: toks, httpapi.HeaderWorldSize: strconv.Itoa(m.world)})
			var want []byte
			for c := 0; c < n; c++ {
				for rk := 0; rk < m.world; rk++ {
					want = append(want, m.object(tensor, n, c, rk)...)
				}
			}
			if !bytes.Equal(raw.body, want) {
				t.Fatalf("%s: L1 objects (%d bytes) are not the tensor's slices (%d bytes)", m.name, len(raw.body), len(want))
			}
			if m.mla && !bytes.Equal(m.object(tensor, n, 1, 0), raw.body[len(want)/n:len(want)/n+len(want)/n/m.world]) {
				t.Fatalf("MLA rank 0 of chunk 1 is not the latent slice")
			}
		}()
	}
}

// TestKVUpstreamPartialPrefix: a retrieve past the stored chunks answers
// the cached prefix as a tensor of the hit tokens only.
func TestKVUpstreamPartialPrefix(t *testing.T) {
	e := startKV(t)
	tensor := kvTP2.tensor(2, 9)
	e.expect(200, "POST", "/api/kv/store", tensor, upstreamStore(kvTP2.name, tokens(0, 2*testChunk), "s1"))
	body := map[string]any{"model_name": kvTP2.name, "tokens": append(tokSlice(0, 2*testChunk), tokSlice(99_000, 2*testChunk)...), "cache_salt": "s1"}
	r := e.expect(200, "POST", "/api/kv/retrieve", body, jsonCT)
	if !bytes.Equal(r.body, tensor) {
		t.Fatalf("partial retrieve: %d bytes, want the %d of 2 chunks", len(r.body), len(tensor))
	}
	wantHeaders(t, r, 2*testChunk, 2, 4*testChunk, 4)
	lk := e.expect(200, "POST", "/api/kv/lookup", body, jsonCT).json(t)
	wantJSON(t, "lookup", lk, map[string]any{"total_tokens": float64(4 * testChunk), "total_chunks": float64(4), "hit_tokens": float64(2 * testChunk), "hit_chunks": float64(2)})
	// Another salt is another key space.
	body["cache_salt"] = "s2"
	if lk := e.expect(200, "POST", "/api/kv/lookup", body, jsonCT).json(t); lk["hit_chunks"] != float64(0) {
		t.Fatalf("other salt lookup = %v", lk)
	}
}

// TestKVUpstreamMiss: nothing cached is upstream's 404 with an empty body,
// the KV media type and the hit headers (also for fewer tokens than a
// chunk).
func TestKVUpstreamMiss(t *testing.T) {
	e := startKV(t)
	r := e.expect(404, "POST", "/api/kv/retrieve", map[string]any{"model_name": testModel, "tokens": tokSlice(5, 3*testChunk+1)}, jsonCT)
	if len(r.body) != 0 || r.header.Get("Content-Type") != httpapi.ContentTypeKV {
		t.Fatalf("miss: body %q, Content-Type %q", r.body, r.header.Get("Content-Type"))
	}
	wantHeaders(t, r, 0, 0, 3*testChunk, 3)
	r = e.expect(404, "POST", "/api/kv/retrieve", map[string]any{"model_name": testModel, "tokens": tokSlice(5, 3)}, jsonCT)
	if len(r.body) != 0 {
		t.Fatalf("sub-chunk miss body %q", r.body)
	}
	wantHeaders(t, r, 0, 0, 0, 0)
}

// TestKVUpstreamErrors: upstream's 400s (unregistered model, missing
// headers, a payload of the wrong length) with their messages, nothing
// stored on a bad request; a model with several world sizes needs
// X-LMCache-World-Size; a layout without num_layers refuses the tensor
// form but keeps the raw-object form.
func TestKVUpstreamErrors(t *testing.T) {
	e := startKV(t,
		`{"model_name":"org/tp2","world_size":1,"num_layers":2,"hidden_size":16,"dtype":"bfloat16"}`,
		`{"model_name":"org/opaque","world_size":1,"object_bytes":512}`)
	detail := func(r resp) string { return r.json(t)["detail"].(string) }
	toks := tokens(0, testChunk)
	for _, path := range []string{"/api/kv/retrieve", "/api/kv/lookup"} {
		r := e.expect(400, "POST", path, map[string]any{"model_name": "nope", "tokens": tokSlice(0, testChunk)}, jsonCT)
		if d := detail(r); d != "model_name 'nope' is not registered with this engine" {
			t.Errorf("%s unregistered: %q", path, d)
		}
	}
	if d := detail(e.expect(400, "POST", "/api/kv/store", kvOne.tensor(1, 1), upstreamStore("nope", toks, ""))); d != "model_name 'nope' is not registered with this engine" {
		t.Errorf("store unregistered: %q", d)
	}
	if d := detail(e.expect(400, "POST", "/api/kv/store", kvOne.tensor(1, 1), map[string]string{httpapi.HeaderTokens: toks})); d != "missing X-LMCache-Model-Name header" {
		t.Errorf("no model header: %q", d)
	}
	if d := detail(e.expect(400, "POST", "/api/kv/store", kvOne.tensor(1, 1), map[string]string{httpapi.HeaderModelName: testModel, httpapi.HeaderTokens: ","})); d != "X-LMCache-Tokens header must contain at least one token" {
		t.Errorf("no tokens: %q", d)
	}
	e.expect(400, "POST", "/api/kv/store", kvOne.tensor(1, 1), upstreamStore(testModel, "1,x", ""))
	both := upstreamStore(testModel, toks, "")
	both[httpapi.HeaderModel] = kvTP2.name
	if d := detail(e.expect(400, "POST", "/api/kv/store", kvOne.tensor(1, 1), both)); !strings.Contains(d, "name different models") {
		t.Errorf("two model headers: %q", d)
	}
	// One byte short: 400 naming the tensor, and nothing stored.
	short := kvOne.tensor(2, 1)
	if d := detail(e.expect(400, "POST", "/api/kv/store", short[:len(short)-1], upstreamStore(testModel, tokens(0, 2*testChunk), ""))); !strings.Contains(d, "KV_2LTD tensor of 2 full chunks") || !strings.Contains(d, strconv.Itoa(len(short))) {
		t.Errorf("short body: %q", d)
	}
	if lk := e.expect(200, "POST", "/api/kv/lookup", map[string]any{"model_name": testModel, "tokens": tokSlice(0, 2*testChunk)}, jsonCT).json(t); lk["hit_chunks"] != float64(0) {
		t.Fatalf("a refused store left chunks: %v", lk)
	}

	// org/tp2 is registered for world sizes 1 and 2.
	if d := detail(e.expect(400, "POST", "/api/kv/store", kvTP2.tensor(1, 1), upstreamStore(kvTP2.name, toks, ""))); !strings.Contains(d, "world sizes [1 2]") {
		t.Errorf("ambiguous: %q", d)
	}
	h := upstreamStore(kvTP2.name, toks, "")
	h[httpapi.HeaderWorldSize] = "2"
	tensor := kvTP2.tensor(1, 4)
	e.expect(200, "POST", "/api/kv/store", tensor, h)
	if r := e.expect(200, "POST", "/api/kv/retrieve", map[string]any{"model_name": kvTP2.name, "tokens": tokSlice(0, testChunk), "world_size": 2}, jsonCT); !bytes.Equal(r.body, tensor) {
		t.Fatalf("world_size 2 retrieve differs")
	}
	e.expect(404, "POST", "/api/kv/retrieve", map[string]any{"model_name": kvTP2.name, "tokens": tokSlice(0, testChunk), "world_size": 1}, jsonCT)

	// object_bytes only: no tensor geometry.
	if d := detail(e.expect(400, "POST", "/api/kv/store", make([]byte, 512), upstreamStore("org/opaque", toks, ""))); !strings.Contains(d, "cannot be read as a KV_2LTD tensor") {
		t.Errorf("opaque: %q", d)
	}
	if m := e.expect(200, "POST", "/api/kv/store", make([]byte, 512), map[string]string{httpapi.HeaderModel: "org/opaque", httpapi.HeaderTokens: toks}).json(t); m["stored"] != float64(1) || m["status"] != "ok" {
		t.Fatalf("opaque raw store = %v", m)
	}
}

// The layouts the fixtures register are the sizes the tests assume.
func TestKVUpstreamFixtureSizes(t *testing.T) {
	for m, want := range map[kvModel]int64{kvOne: objBytes, kvTP2: objBytes, kvMLA: 512} {
		l, err := httpapi.ParseRegisterModel(m.register(), testChunk)
		if err != nil {
			t.Fatal(err)
		}
		if l.ObjectBytes != want || int64(len(m.object(m.tensor(1, 0), 1, 0, 0))) != want {
			t.Errorf("%s: object %d bytes, want %d", m.name, l.ObjectBytes, want)
		}
	}
}
