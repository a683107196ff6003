package mq_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvcopy/kvcopytest"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// fmtCache is one rank's paged KV cache in /dev/shm in a given vLLM
// format, one fp16 segment per layer: HND [2, nb, nh, bs, hs] or MLA's
// latent cache [nb, bs, hs] (nh = 1), sized so that a chunk object
// matches the harness (hidden 64).
type fmtCache struct {
	format         string
	nb, bs, nh, hs int
	names          []string
	maps           [][]byte
}

func newFmtCache(t *testing.T, format string, seed uint64) *fmtCache {
	t.Helper()
	c := &fmtCache{format: format, nb: 16, bs: 8, nh: 4, hs: 16}
	if format == "MLA" {
		c.nh, c.hs = 1, testHidden
	}
	r := rand.New(rand.NewPCG(seed, 31))
	for range testLayers {
		name, m := kvcopytest.Segment(t, "mqtest", c.nkv()*c.nb*c.nh*c.bs*c.hs*2, r)
		c.names, c.maps = append(c.names, name), append(c.maps, m)
	}
	return c
}

func (c *fmtCache) nkv() int {
	if c.format == "MLA" {
		return 1
	}
	return 2
}

func (c *fmtCache) shape() []int {
	if c.format == "MLA" {
		return []int{c.nb, c.bs, c.hs}
	}
	return []int{2, c.nb, c.nh, c.bs, c.hs}
}

// head is the bytes of one head of (kv, layer, block, token).
func (c *fmtCache) head(kv, l, b, tok, h int) []byte {
	n := c.hs * 2
	o := ((((kv*c.nb+b)*c.nh+h)*c.bs + tok) * c.hs) * 2
	return c.maps[l][o : o+n]
}

// row is (kv, layer, block, token) in the object's (head, dim) order.
func (c *fmtCache) row(kv, l, b, tok int) []byte {
	var out []byte
	for h := range c.nh {
		out = append(out, c.head(kv, l, b, tok, h)...)
	}
	return out
}

// object is a chunk's engine-driven object by definition: KV_2LTD, or
// [layers, chunk, latent] for MLA.
func (c *fmtCache) object(blocks []int) []byte {
	var out []byte
	for kv := range c.nkv() {
		for l := range testLayers {
			for _, b := range blocks {
				for tok := range c.bs {
					out = append(out, c.row(kv, l, b, tok)...)
				}
			}
		}
	}
	return out
}

func (c *fmtCache) registerFrames(t *testing.T, inst int64, model string, world int) [][]byte {
	t.Helper()
	shape := c.shape()
	stride := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i], acc = acc, acc*shape[i]
	}
	var specs []map[string]any
	for _, n := range c.names {
		specs = append(specs, map[string]any{"name": "/" + n, "nbytes": len(c.maps[0]), "shape": shape, "stride": stride})
	}
	hint := "HND"
	if c.format == "MLA" {
		hint = "" // MLA is told by its rank-3 shape
	}
	return lmdRegisterFrames(t, inst, model, int64(world), specs, hint, c.bs)
}

// TestLMDFormatsEndToEnd, through the real ZMQ socket and engine, for
// vLLM's HND cache and MLA's latent cache at world_size 1 and 2: every
// rank REGISTER_KV_CACHEs its own /dev/shm cache and STOREs a two-chunk
// prompt from shuffled blocks; LOOKUP over all ranks hits both chunks
// only once every rank stored, and a longer prompt sharing that prefix
// hits 2 of its 3 chunks (a partial hit); an engine-driven worker of each
// rank reads objects byte-exact to the format's definition; RETRIEVE of
// the partial hit into fresh blocks with skip_first_n_tokens 3 writes
// every row but the first three, which stay as they were; an object an
// engine-driven worker stored is RETRIEVEd into blocks byte-exact. The
// copies are counted in lmcache_mp_transfer_{bytes,chunks,copy_seconds}_total
// under path lmcache_driven_cpu, a retrieve's skipped rows left out.
func TestLMDFormatsEndToEnd(t *testing.T) {
	for _, format := range []string{"HND", "MLA"} {
		for _, world := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/world_size_%d", format, world), func(t *testing.T) {
				lmdFormatEndToEnd(t, format, world)
			})
		}
	}
}

func lmdFormatEndToEnd(t *testing.T, format string, world int) {
	h := start(t, opts{})
	sched := h.dial(mqclient.Options{})
	model := fmt.Sprintf("%s-%d", format, world)
	mla := format == "MLA"
	tokens := prompt(41, 2*testChunk)
	longer := append(append([]wire.Int(nil), tokens...), prompt(42, testChunk)...)
	type rank struct {
		c     *mqclient.Client
		cache *fmtCache
		inst  int64
	}
	var ranks []rank
	for r := range world {
		rk := rank{c: h.dial(mqclient.Options{}), cache: newFmtCache(t, format, uint64(10*world+r)), inst: int64(60 + r)}
		if b, err := rk.c.Call(wire.OpRegisterKVCache, rk.cache.registerFrames(t, rk.inst, model, world)...); err != nil || !bytes.Equal(b, wire.Nil) {
			t.Fatalf("rank %d REGISTER_KV_CACHE = %x %v", r, b, err)
		}
		ranks = append(ranks, rk)
	}
	call := func(r int, op wire.Op, toks []wire.Int, end int, reqID string, tail ...[]byte) []byte {
		t.Helper()
		k := wire.Marshal(key(model, world, r, toks, 0, end, reqID))
		b, err := ranks[r].c.Call(op, append([][]byte{k, wire.EncodeInt(ranks[r].inst)}, tail...)...)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	stored := []int{5, 6, 1, 2}
	for r := range world {
		if r == 1 {
			if n := lookupOnce(t, sched, key(model, world, -1, tokens, 0, len(tokens), "half")); n != 0 {
				t.Fatalf("LOOKUP over %d ranks hit %d chunks with only rank 0 stored", world, n)
			}
		}
		if b := call(r, wire.OpStore, tokens, len(tokens), "s", blockIDs(stored...), msgp.AppendBytes(nil, nil)); !bytes.Equal(b, transferOK) {
			t.Fatalf("rank %d STORE = %x", r, b)
		}
	}
	lookupUntil(t, sched, key(model, world, -1, tokens, 0, len(tokens), "x"), 2)
	objBytes := len(ranks[0].cache.object(stored[:2]))
	tm := h.srv.Metrics()
	transferred := func(direction, what string) float64 {
		if what == "chunks" {
			return counterValue(tm.TransferChunks.WithLabelValues(direction, "lmcache_driven_cpu"))
		}
		return counterValue(tm.TransferBytes.WithLabelValues(direction, "lmcache_driven_cpu"))
	}
	if got, want := transferred("store", "bytes"), float64(world*2*objBytes); got != want {
		t.Fatalf("store bytes counted %v, want %v", got, want)
	}
	if got := transferred("store", "chunks"); got != float64(2*world) {
		t.Fatalf("store chunks counted %v, want %d", got, 2*world)
	}
	if n := counterValue(tm.TransferCopySeconds.WithLabelValues("store", "lmcache_driven_cpu")); n <= 0 {
		t.Fatalf("store copy seconds counted %v", n)
	}

	// Cross-path: each rank's engine-driven worker reads its objects
	// (under the read locks of LOOKUP "x").
	workers := make([]*worker, world)
	for r := range world {
		p := regPayload(int64(70+r), model, world)
		p.UseMLA = mla
		c := h.dial(mqclient.Options{})
		resp, err := c.Register(p)
		if err != nil || resp.ShmName == "" {
			t.Fatalf("engine-driven registration = %+v %v", resp, err)
		}
		pool, err := mqclient.OpenPool(h.shmDir, resp.ShmName, int64(resp.PoolSize))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pool.Close() })
		workers[r] = &worker{h: h, c: c, inst: int64(70 + r), rank: r, world: world, pool: pool, model: model}
		want := [][]byte{ranks[r].cache.object(stored[:2]), ranks[r].cache.object(stored[2:])}
		if !workers[r].retrieve(tokens, 0, len(tokens), "x", func(c int) []byte { return want[c] }) {
			t.Fatalf("rank %d: engine-driven PREPARE_RETRIEVE of lmcache-driven objects failed", r)
		}
	}

	// A partial hit, retrieved into fresh blocks past the first 3 tokens.
	lookupUntil(t, sched, key(model, world, -1, longer, 0, len(longer), "partial"), 2)
	fresh := []int{9, 10, 11, 12}
	for r, rk := range ranks {
		c := rk.cache
		// The rows skip_first_n_tokens protects, as they were (random
		// bytes unlike the stored ones, so a write would show).
		kept := map[[3]int][]byte{}
		for kv := range c.nkv() {
			for l := range testLayers {
				for tok := range 3 {
					kept[[3]int{kv, l, tok}] = bytes.Clone(c.row(kv, l, fresh[0], tok))
					if bytes.Equal(kept[[3]int{kv, l, tok}], c.row(kv, l, stored[0], tok)) {
						t.Fatal("the fresh and stored blocks start equal; the skip would not show")
					}
				}
			}
		}
		if b := call(r, wire.OpRetrieve, longer, 2*testChunk, "partial", blockIDs(fresh...), msgp.AppendBytes(nil, nil), wire.EncodeInt(3)); !bytes.Equal(b, transferOK) {
			t.Fatalf("rank %d RETRIEVE = %x", r, b)
		}
		for kv := range c.nkv() {
			for l := range testLayers {
				for tok := range 2 * testChunk {
					got, exp := c.row(kv, l, fresh[tok/c.bs], tok%c.bs), c.row(kv, l, stored[tok/c.bs], tok%c.bs)
					if tok < 3 {
						exp = kept[[3]int{kv, l, tok}]
					}
					if !bytes.Equal(got, exp) {
						t.Fatalf("rank %d kv %d layer %d token %d: retrieved row differs", r, kv, l, tok)
					}
				}
			}
		}
	}

	// The skipped tokens were not moved, so not counted.
	rowBytes := len(ranks[0].cache.row(0, 0, 0, 0))
	if got, want := transferred("retrieve", "bytes"), float64(world*(2*objBytes-ranks[0].cache.nkv()*testLayers*3*rowBytes)); got != want {
		t.Fatalf("retrieve bytes counted %v, want %v", got, want)
	}
	if got := transferred("retrieve", "chunks"); got != float64(2*world) {
		t.Fatalf("retrieve chunks counted %v, want %d", got, 2*world)
	}

	// An engine-driven store, read back through RETRIEVE.
	other := prompt(43, testChunk)
	objs := make([][]byte, world)
	for r, w := range workers {
		k := key(model, world, r, other, 0, testChunk, "e")
		plan, err := w.c.PrepareStore(k, w.inst)
		if err != nil || len(plan.Slots) != 1 {
			t.Fatalf("rank %d PREPARE_STORE = %+v %v", r, plan, err)
		}
		mem, err := w.pool.Slot(plan.Slots[0])
		if err != nil {
			t.Fatal(err)
		}
		for i := range mem {
			mem[i] = byte(rand.Uint32())
		}
		objs[r] = bytes.Clone(mem)
		if ok, err := w.c.CommitStore(k, w.inst, nil); err != nil || !ok {
			t.Fatalf("rank %d COMMIT_STORE = %v %v", r, ok, err)
		}
	}
	lookupUntil(t, sched, key(model, world, -1, other, 0, testChunk, "e"), 1)
	// The engine-driven workers' transfers: 2 chunks read, 1 written each.
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"engine-driven retrieve bytes", counterValue(tm.TransferBytes.WithLabelValues("retrieve", "engine_driven")), float64(world * 2 * objBytes)},
		{"engine-driven retrieve chunks", counterValue(tm.TransferChunks.WithLabelValues("retrieve", "engine_driven")), float64(world * 2)},
		{"engine-driven store bytes", counterValue(tm.TransferBytes.WithLabelValues("store", "engine_driven")), float64(world * objBytes)},
		{"engine-driven store chunks", counterValue(tm.TransferChunks.WithLabelValues("store", "engine_driven")), float64(world)},
	} {
		if c.got != c.want {
			t.Errorf("%s counted %v, want %v", c.name, c.got, c.want)
		}
	}
	for r, rk := range ranks {
		if b := call(r, wire.OpRetrieve, other, testChunk, "e", blockIDs(13, 14), msgp.AppendBytes(nil, nil), wire.EncodeInt(0)); !bytes.Equal(b, transferOK) {
			t.Fatalf("rank %d RETRIEVE of an engine-driven object = %x", r, b)
		}
		if got := rk.cache.object([]int{13, 14}); !bytes.Equal(got, objs[r]) {
			t.Fatalf("rank %d: the engine-driven object was scattered into blocks wrong", r)
		}
	}
}
