package mq_test

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/kvcopy"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/polltest"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, 10*time.Second, what, cond)
}

// TestLMDMappingsReleased: every kvcopy mapping is released on
// UNREGISTER_KV_CACHE, when the reaper drops a silent worker (counted in
// lmcache_mp_zmq_reaped_workers_total; the layout reference goes with it),
// and when the server stops.
func TestLMDMappingsReleased(t *testing.T) {
	base := kvcopy.OpenMappings()
	h := start(t, opts{mq: func(c *mq.Config) {
		c.WorkerRegistrationGrace = 300 * time.Millisecond
		c.WorkerReapTimeout = 300 * time.Millisecond
	}})
	c := h.dial(mqclient.Options{})
	pc := newPagedCache(t)
	register := func(inst int64) {
		t.Helper()
		if b, err := c.Call(wire.OpRegisterKVCache, pc.registerFrames(t, inst)...); err != nil || !bytes.Equal(b, wire.Nil) {
			t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
		}
		if n := kvcopy.OpenMappings() - base; n != testLayers {
			t.Fatalf("after REGISTER_KV_CACHE %d mappings are open, want %d", n, testLayers)
		}
	}

	register(7)
	if b, err := c.Call(wire.OpUnregisterKVCache, wire.EncodeInt(7)); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("UNREGISTER_KV_CACHE = %x %v", b, err)
	}
	if n := kvcopy.OpenMappings() - base; n != 0 {
		t.Fatalf("after UNREGISTER_KV_CACHE %d mappings are open", n)
	}

	reaped := counterValue(h.srv.Metrics().ZMQReapedWorkers)
	register(8)
	// The reap is logged after the unmap: wait for both.
	waitFor(t, "the reaper to unmap the silent worker", func() bool {
		return kvcopy.OpenMappings() == base && strings.Contains(h.logs.String(), "reaped a silent lmcache-driven worker")
	})
	if n := counterValue(h.srv.Metrics().ZMQReapedWorkers) - reaped; n != 1 {
		t.Fatalf("reaped workers counted %v, want 1", n)
	}
	if b, err := c.Call(wire.OpPing, wire.EncodeInt(8)); err != nil || !bytes.Equal(b, wire.EncodeInt(2)) {
		t.Fatalf("PING of the reaped instance = %x %v, want 2 (untracked)", b, err)
	}
	// The reaped registration was the last holder of the model's layout.
	if _, err := h.eng.Layout("m", 1); !errors.Is(err, engine.ErrNoLayout) {
		t.Fatalf("engine layout after the reap: %v, want ErrNoLayout", err)
	}

	register(9)
	h.stop()
	if n := kvcopy.OpenMappings() - base; n != 0 {
		t.Fatalf("after the server stopped %d mappings are open", n)
	}
}

// TestLMDTransferModes: --supported-transfer-mode lmcache_driven refuses
// engine-driven operations and engine_driven refuses lmcache-driven ones,
// each with its negative reply, one WARN line per peer naming both modes,
// and lmcache_mp_zmq_refused_requests_total{reason="transfer_mode"} per
// request; auto serves both (TestLMCacheDrivenCPUEndToEnd).
func TestLMDTransferModes(t *testing.T) {
	t.Run("lmcache_driven", func(t *testing.T) {
		h := start(t, opts{mq: func(c *mq.Config) { c.TransferMode = mq.ModeLMCacheDriven }})
		c := h.dial(mqclient.Options{})
		for range 2 {
			// The negative reply is nil, which the client cannot read as a
			// registration.
			if resp, err := c.Register(regPayload(3, "m", 1)); err == nil || !strings.Contains(err.Error(), `"nil"`) {
				t.Fatalf("REGISTER_ENGINE_DRIVEN under lmcache_driven = %+v %v", resp, err)
			}
		}
		if plan, err := c.PrepareStore(key("m", 1, 0, prompt(1, testChunk), 0, testChunk, "r"), 3); err != nil || len(plan.Slots) != 0 {
			t.Fatalf("PREPARE_STORE under lmcache_driven = %+v %v", plan, err)
		}
		if n := counterValue(h.srv.Metrics().ZMQRefused.WithLabelValues("transfer_mode")); n != 3 {
			t.Errorf("transfer_mode refusals counted %v, want 3", n)
		}
		logs := h.logs.String()
		if n := strings.Count(logs, "runs --supported-transfer-mode lmcache_driven"); n != 1 {
			t.Errorf("mode mismatch logged %d times, want once per peer:\n%s", n, logs)
		}
		if !strings.Contains(logs, "worker uses the engine_driven transfer mode") {
			t.Errorf("the log line does not name the worker's mode:\n%s", logs)
		}
		// The lmcache-driven path itself is served.
		pc := newPagedCache(t)
		if b, err := c.Call(wire.OpRegisterKVCache, pc.registerFrames(t, 4)...); err != nil || !bytes.Equal(b, wire.Nil) {
			t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
		}
		k := wire.Marshal(key("m", 1, 0, prompt(2, testChunk), 0, testChunk, "r2"))
		if b, err := c.Call(wire.OpStore, k, wire.EncodeInt(4), blockIDs(1, 2), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferOK) {
			t.Fatalf("STORE under lmcache_driven = %x %v", b, err)
		}
	})
	t.Run("engine_driven", func(t *testing.T) {
		base := kvcopy.OpenMappings()
		h := start(t, opts{mq: func(c *mq.Config) { c.TransferMode = mq.ModeEngineDriven }})
		c := h.dial(mqclient.Options{})
		pc := newPagedCache(t)
		if b, err := c.Call(wire.OpRegisterKVCache, pc.registerFrames(t, 4)...); err != nil || !bytes.Equal(b, wire.Nil) {
			t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
		}
		if n := kvcopy.OpenMappings() - base; n != 0 {
			t.Fatalf("a refused registration mapped %d segments", n)
		}
		k := wire.Marshal(key("m", 1, 0, prompt(2, testChunk), 0, testChunk, "r2"))
		if b, err := c.Call(wire.OpStore, k, wire.EncodeInt(4), blockIDs(1, 2), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferFailed) {
			t.Fatalf("STORE under engine_driven = %x %v", b, err)
		}
		if n := counterValue(h.srv.Metrics().ZMQRefused.WithLabelValues("transfer_mode")); n != 2 {
			t.Errorf("transfer_mode refusals counted %v, want 2", n)
		}
		logs := h.logs.String()
		if n := strings.Count(logs, "runs --supported-transfer-mode engine_driven"); n != 1 {
			t.Errorf("mode mismatch logged %d times, want once per peer:\n%s", n, logs)
		}
		// The engine-driven path itself is served.
		w := h.worker(5, "m", 1, 0)
		if n := w.store(prompt(3, testChunk), 0, testChunk, "r3", chunkData{}.of(3, 0)); n != 1 {
			t.Fatalf("engine-driven store under engine_driven asked for %d chunks", n)
		}
	})
}

// TestLMDWorldSize2: two lmcache-driven ranks of one model (world_size 2)
// store their own blocks under their worker ids; a lookup over all ranks
// hits only once both stored; each rank RETRIEVEs its own bytes, not the
// other rank's.
func TestLMDWorldSize2(t *testing.T) {
	h := start(t, opts{})
	sched := h.dial(mqclient.Options{})
	tokens := prompt(11, 2*testChunk)
	type rank struct {
		c  *mqclient.Client
		pc *pagedCache
	}
	var ranks []rank
	for r := range 2 {
		c := h.dial(mqclient.Options{})
		pc := newPagedCache(t)
		rnd := rand.New(rand.NewPCG(uint64(r), 99))
		for _, m := range pc.maps {
			for i := range m {
				m[i] = byte(rnd.Uint32())
			}
		}
		frames := pc.registerFrames(t, int64(20+r))
		frames[3] = wire.EncodeInt(2)
		if b, err := c.Call(wire.OpRegisterKVCache, frames...); err != nil || !bytes.Equal(b, wire.Nil) {
			t.Fatalf("rank %d REGISTER_KV_CACHE = %x %v", r, b, err)
		}
		ranks = append(ranks, rank{c, pc})
	}
	store := func(r int) {
		t.Helper()
		k := wire.Marshal(key("m", 2, r, tokens, 0, len(tokens), "s"))
		if b, err := ranks[r].c.Call(wire.OpStore, k, wire.EncodeInt(int64(20+r)), blockIDs(1, 2, 3, 4), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferOK) {
			t.Fatalf("rank %d STORE = %x %v", r, b, err)
		}
	}
	store(0)
	if n := lookupOnce(t, sched, key("m", 2, -1, tokens, 0, len(tokens), "l0")); n != 0 {
		t.Fatalf("lookup over both ranks hit %d chunks with only rank 0 stored", n)
	}
	store(1)
	lookupUntil(t, sched, key("m", 2, -1, tokens, 0, len(tokens), "l1"), 2)
	for r, rk := range ranks {
		k := wire.Marshal(key("m", 2, r, tokens, 0, len(tokens), "l1"))
		if b, err := rk.c.Call(wire.OpRetrieve, k, wire.EncodeInt(int64(20+r)), blockIDs(9, 10, 11, 12), msgp.AppendBytes(nil, nil), wire.EncodeInt(0)); err != nil || !bytes.Equal(b, transferOK) {
			t.Fatalf("rank %d RETRIEVE = %x %v", r, b, err)
		}
		for l := range testLayers {
			for kv := range 2 {
				for tok := range 2 * testChunk {
					got, want := rk.pc.row(kv, l, 9+tok/pcBS, tok%pcBS), rk.pc.row(kv, l, 1+tok/pcBS, tok%pcBS)
					if !bytes.Equal(got, want) {
						t.Fatalf("rank %d kv %d layer %d token %d: retrieved bytes differ from what the rank stored", r, kv, l, tok)
					}
				}
			}
		}
	}
	if bytes.Equal(ranks[0].pc.row(0, 0, 9, 0), ranks[1].pc.row(0, 0, 9, 0)) {
		t.Fatal("both ranks hold the same bytes; the test cannot tell their objects apart")
	}
}

// TestLMDStatusAndChecksums: through the real HTTP routes, GET /status
// lists a registered lmcache-driven context in registered_gpu_ids and
// cache_context_meta, and POST /cache/checksums answers MD5 digests of its
// blocks equal to ones computed here from the client's own segments
// (aggregated and layerwise); an unknown instance is 404.
func TestLMDStatusAndChecksums(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	pc := newPagedCache(t)
	if b, err := c.Call(wire.OpRegisterKVCache, pc.registerFrames(t, 7)...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
	}
	api, err := httpapi.New(httpapi.Options{Engine: h.eng, StatusExtra: h.srv.Status, KVBlocks: h.srv})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api.Handler())
	defer hs.Close()
	do := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
		}
		return resp.StatusCode, out
	}

	code, st := do("GET", "/status", "")
	if code != 200 {
		t.Fatalf("GET /status = %d %v", code, st)
	}
	if ids := fmt.Sprint(st["registered_gpu_ids"]); ids != "[7]" {
		t.Fatalf("registered_gpu_ids = %s", ids)
	}
	// cache_size_per_token is one token's slice of a chunk object: K and
	// V of every layer, fp16 (a size, which the response redaction leaves
	// alone although its name ends in "_token").
	meta, _ := st["cache_context_meta"].(map[string]any)["7"].(map[string]any)
	layout, _ := meta["kv_cache_layout"].(map[string]any)
	if meta["model_name"] != "m" || meta["world_size"] != 1.0 || layout["num_layers"] != float64(testLayers) ||
		layout["num_blocks"] != float64(pcBlocks) || layout["cache_size_per_token"] != float64(2*testLayers*pcHeads*pcHS*2) {
		t.Fatalf("cache_context_meta[7] = %v", meta)
	}
	// Every field the data path adds is a typed member of the documented
	// response: the body decodes into httpapi.StatusResponse with unknown
	// fields refused (its untyped Extra has no JSON name).
	resp, err := hs.Client().Get(hs.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var typed httpapi.StatusResponse
	if err := dec.Decode(&typed); err != nil {
		t.Fatalf("/status has a field StatusResponse does not type: %v\n%s", err, raw)
	}
	if typed.KVEvents == nil || typed.PendingLookups == nil || typed.PendingTransfers == nil || typed.CacheContextMeta["7"].Transfer == nil {
		t.Fatalf("data-path fields missing from /status: %s", raw)
	}
	groups, _ := layout["kernel_groups"].([]any)
	if len(groups) != 1 || groups[0].(map[string]any)["tokens_per_block"] != float64(pcBS) || groups[0].(map[string]any)["dtype"] != "torch.float16" {
		t.Fatalf("kernel_groups = %v", layout["kernel_groups"])
	}

	// A block of a layer is its K rows then its V rows.
	block := func(l, b int) []byte {
		var out []byte
		for kv := range 2 {
			for tok := range pcBS {
				out = append(out, pc.row(kv, l, b, tok)...)
			}
		}
		return out
	}
	ids := []int{3, 0, 5, 9, 2}
	sum := func(layers []int, bs []int) string {
		m := md5.New()
		for _, l := range layers {
			for _, b := range bs {
				m.Write(block(l, b))
			}
		}
		return hex.EncodeToString(m.Sum(nil))
	}
	code, res := do("POST", "/cache/checksums", `{"instance_id": 7, "block_ids": [3, 0, 5, 9, 2], "chunk_size": 2}`)
	if code != 200 {
		t.Fatalf("POST /cache/checksums = %d %v", code, res)
	}
	want := []string{sum([]int{0, 1}, ids[0:2]), sum([]int{0, 1}, ids[2:4]), sum([]int{0, 1}, ids[4:])}
	if got := fmt.Sprint(res["chunk_checksums"]); got != fmt.Sprint(want) || res["num_chunks"] != 3.0 {
		t.Fatalf("chunk_checksums = %s, want %v (%v)", got, want, res)
	}
	code, res = do("POST", "/cache/checksums", `{"instance_id": 7, "block_ids": [3, 0, 5, 9, 2], "chunk_size": 2, "layerwise": true}`)
	if code != 200 {
		t.Fatalf("layerwise POST /cache/checksums = %d %v", code, res)
	}
	lw, _ := res["chunk_checksums"].(map[string]any)
	for l := range testLayers {
		want := []string{sum([]int{l}, ids[0:2]), sum([]int{l}, ids[2:4]), sum([]int{l}, ids[4:])}
		if got := fmt.Sprint(lw[fmt.Sprintf("layer_%d", l)]); got != fmt.Sprint(want) {
			t.Fatalf("layer_%d checksums = %s, want %v", l, got, want)
		}
	}
	if code, res := do("POST", "/cache/checksums", `{"instance_id": 8, "block_ids": [0], "chunk_size": 1}`); code != 404 {
		t.Fatalf("checksums of an unknown instance = %d %v", code, res)
	}
	if code, res := do("POST", "/cache/checksums", fmt.Sprintf(`{"instance_id": 7, "block_ids": [%d], "chunk_size": 1}`, pcBlocks)); code != 400 {
		t.Fatalf("checksums of a block past the cache = %d %v", code, res)
	}
}
