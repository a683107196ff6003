package mq_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvcopy/kvcopytest"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// pagedCache is a client's NHD paged KV cache in /dev/shm, one segment per
// layer: [2, nb, bs, nh, hs] float16, 2 layers × 4 heads × 16 = the
// harness's 64-wide hidden, so a 16-token chunk object is testObj bytes.
type pagedCache struct {
	names []string
	maps  [][]byte
}

const (
	pcBlocks = 16
	pcBS     = 8
	pcHeads  = 4
	pcHS     = 16
)

func newPagedCache(t *testing.T) *pagedCache {
	t.Helper()
	pc := &pagedCache{}
	r := rand.New(rand.NewPCG(77, 7))
	for range testLayers {
		name, m := kvcopytest.Segment(t, "mqtest", 2*pcBlocks*pcBS*pcHeads*pcHS*2, r)
		pc.names, pc.maps = append(pc.names, name), append(pc.maps, m)
	}
	return pc
}

// row is one (kv, layer, block, token) row: 4 heads × 16 fp16.
func (pc *pagedCache) row(kv, l, b, tok int) []byte {
	n := pcHeads * pcHS * 2
	o := ((kv*pcBlocks+b)*pcBS + tok) * n
	return pc.maps[l][o : o+n]
}

// object is a chunk's engine-driven object (KV_2LTD) by definition.
func (pc *pagedCache) object(blocks []int) []byte {
	var out []byte
	for kv := range 2 {
		for l := range testLayers {
			for _, b := range blocks {
				for tok := range pcBS {
					out = append(out, pc.row(kv, l, b, tok)...)
				}
			}
		}
	}
	return out
}

// objRow is row (kv, layer, token) of a KV_2LTD object.
func objRow(obj []byte, kv, l, tok int) []byte {
	n := testHidden * 2
	o := ((kv*testLayers+l)*testChunk + tok) * n
	return obj[o : o+n]
}

// registerFrames are REGISTER_KV_CACHE's 7 payload frames for pc.
func (pc *pagedCache) registerFrames(t *testing.T, inst int64) [][]byte {
	t.Helper()
	var specs []map[string]any
	for _, n := range pc.names {
		specs = append(specs, map[string]any{"name": "/" + n, "nbytes": len(pc.maps[0]),
			"shape":  []int{2, pcBlocks, pcBS, pcHeads, pcHS},
			"stride": []int{pcBlocks * pcBS * pcHeads * pcHS, pcBS * pcHeads * pcHS, pcHeads * pcHS, pcHS, 1}})
	}
	return lmdRegisterFrames(t, inst, "m", 1, specs, "NHD", pcBS)
}

// lmdRegisterFrames are REGISTER_KV_CACHE's 7 payload frames: the
// wrappers of specs (name, nbytes, shape, stride; pickled by python3),
// and layout hints kv_layout (left out when empty) and tokens_per_block.
func lmdRegisterFrames(t *testing.T, inst int64, model string, world int64, specs []map[string]any, kvLayout string, blockSize int) [][]byte {
	t.Helper()
	return kvcopytest.RegisterFrames(inst, kvcopytest.Wrappers(t, kvcopytest.CPUShmPickler, specs), model, world, kvLayout, blockSize)
}

func blockIDs(ids ...int) []byte {
	b := msgp.AppendArrayHeader(nil, 1)
	b = msgp.AppendArrayHeader(b, uint32(len(ids)))
	for _, id := range ids {
		b = msgp.AppendInt(b, id)
	}
	return b
}

var (
	transferOK     = []byte{0x92, 0xc4, 0x00, 0xc3}
	transferFailed = []byte{0x92, 0xc4, 0x00, 0xc2}
)

// TestLMCacheDrivenCPUEndToEnd: through the real ZMQ socket and engine, a
// worker registers a /dev/shm paged cache with python-pickled
// CpuShmTensorWrappers (REGISTER_KV_CACHE), STOREs blocks, and the objects
// are byte-exact what an engine-driven worker then reads with
// PREPARE_RETRIEVE; RETRIEVE scatters them into other blocks honouring
// skip_first_n_tokens; an engine-driven store is RETRIEVEd into blocks;
// a short block table stores nothing; PING knows the instance; after
// UNREGISTER_KV_CACHE, and for a registration carrying a foreign pickle,
// transfers are refused.
func TestLMCacheDrivenCPUEndToEnd(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	sched := h.dial(mqclient.Options{})
	pc := newPagedCache(t)
	if b, err := c.Call(wire.OpRegisterKVCache, pc.registerFrames(t, 7)...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
	}
	if b, err := c.Call(wire.OpPing, wire.EncodeInt(7)); err != nil || bytes.Equal(b, wire.EncodeInt(2)) {
		t.Fatalf("PING of the lmcache-driven instance = %x %v (2 = untracked)", b, err)
	}

	tokens := prompt(3, 2*testChunk)
	store := func(tokens []wire.Int, reqID string, ids ...int) []byte {
		t.Helper()
		k := wire.Marshal(key("m", 1, 0, tokens, 0, len(tokens), reqID))
		b, err := c.Call(wire.OpStore, k, wire.EncodeInt(7), blockIDs(ids...), msgp.AppendBytes(nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	retrieve := func(tokens []wire.Int, reqID string, skip int, ids ...int) []byte {
		t.Helper()
		lookupUntil(t, sched, key("m", 1, -1, tokens, 0, len(tokens), reqID), len(tokens)/testChunk)
		k := wire.Marshal(key("m", 1, 0, tokens, 0, len(tokens), reqID))
		b, err := c.Call(wire.OpRetrieve, k, wire.EncodeInt(7), blockIDs(ids...), msgp.AppendBytes(nil, nil), wire.EncodeInt(int64(skip)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := store(tokens, "r1", 5, 6, 1, 2); !bytes.Equal(b, transferOK) {
		t.Fatalf("STORE = %x", b)
	}
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "r1"), 2)

	// The engine-driven path reads what the lmcache-driven path stored.
	w := h.worker(8, "m", 1, 0)
	want := [][]byte{pc.object([]int{5, 6}), pc.object([]int{1, 2})}
	if !w.retrieve(tokens, 0, 2*testChunk, "r1", func(c int) []byte { return want[c] }) {
		t.Fatal("engine-driven PREPARE_RETRIEVE of lmcache-driven objects failed")
	}

	// RETRIEVE into fresh blocks, leaving the first 3 tokens alone.
	before := [][]byte{bytes.Clone(pc.maps[0]), bytes.Clone(pc.maps[1])}
	if b := retrieve(tokens, "r2", 3, 9, 10, 11, 12); !bytes.Equal(b, transferOK) {
		t.Fatalf("RETRIEVE = %x", b)
	}
	src, dst := []int{5, 6, 1, 2}, []int{9, 10, 11, 12}
	for kv := range 2 {
		for l := range testLayers {
			for tok := range 2 * testChunk {
				got, exp := pc.row(kv, l, dst[tok/pcBS], tok%pcBS), pc.row(kv, l, src[tok/pcBS], tok%pcBS)
				if tok < 3 {
					o := ((kv*pcBlocks+dst[0])*pcBS + tok) * pcHeads * pcHS * 2
					exp = before[l][o : o+len(got)]
				}
				if !bytes.Equal(got, exp) {
					t.Fatalf("kv %d layer %d token %d: retrieved row differs", kv, l, tok)
				}
			}
		}
	}

	// An engine-driven store, read back through RETRIEVE.
	tokens2 := prompt(4, testChunk)
	data := chunkData{}
	if n := w.store(tokens2, 0, testChunk, "r3", data.of(4, 0)); n != 1 {
		t.Fatalf("engine-driven store asked for %d chunks", n)
	}
	if b := retrieve(tokens2, "r3", 0, 13, 14); !bytes.Equal(b, transferOK) {
		t.Fatalf("RETRIEVE of an engine-driven object = %x", b)
	}
	obj := data.get(4, 0, 0)
	for kv := range 2 {
		for l := range testLayers {
			for tok := range testChunk {
				if !bytes.Equal(pc.row(kv, l, []int{13, 14}[tok/pcBS], tok%pcBS), objRow(obj, kv, l, tok)) {
					t.Fatalf("kv %d layer %d token %d: engine-driven object scattered wrong", kv, l, tok)
				}
			}
		}
	}

	// Too few block ids: nothing is stored, not even the covered chunk.
	tokens3 := prompt(5, 2*testChunk)
	if b := store(tokens3, "r4", 3, 4); !bytes.Equal(b, transferFailed) {
		t.Fatalf("STORE with a short block table = %x", b)
	}
	if n := lookupOnce(t, sched, key("m", 1, -1, tokens3, 0, 2*testChunk, "r4")); n != 0 {
		t.Fatalf("short-table store left %d chunks", n)
	}
	// A block id past the cache refuses the whole store too.
	if b := store(tokens3, "r4", 3, 4, 7, pcBlocks); !bytes.Equal(b, transferFailed) {
		t.Fatalf("STORE with a block id out of range = %x", b)
	}
	if n := lookupOnce(t, sched, key("m", 1, -1, tokens3, 0, 2*testChunk, "r4")); n != 0 {
		t.Fatalf("out-of-range store left %d chunks", n)
	}

	if b, err := c.Call(wire.OpUnregisterKVCache, wire.EncodeInt(7)); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("UNREGISTER_KV_CACHE = %x %v", b, err)
	}
	if b := store(tokens3, "r5", 3, 4, 7, 8); !bytes.Equal(b, transferFailed) {
		t.Fatalf("STORE after UNREGISTER_KV_CACHE = %x", b)
	}

	// A registration whose pickle names os.system is refused, loudly.
	evil, err := os.ReadFile("../kvwrap/testdata/bad_reduce_os_system.pkl")
	if err != nil {
		t.Fatal(err)
	}
	frames := pc.registerFrames(t, 9)
	frames[1], _ = msgp.AppendExtension(msgp.AppendArrayHeader(nil, 1), &msgp.RawExtension{Type: 1, Data: evil})
	if b, err := c.Call(wire.OpRegisterKVCache, frames...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE with a foreign pickle = %x %v", b, err)
	}
	k := wire.Marshal(key("m", 1, 0, tokens3, 0, 2*testChunk, "r6"))
	if b, err := c.Call(wire.OpStore, k, wire.EncodeInt(9), blockIDs(3, 4, 7, 8), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferFailed) {
		t.Fatalf("STORE after a refused registration = %x %v", b, err)
	}
	refused := h.srv.Metrics().ZMQRefused
	for reason, want := range map[string]float64{"lmcache_driven_registration": 1, "lmcache_driven_transfer": 2, "lmcache_driven_unregistered": 2} {
		if n := counterValue(refused.WithLabelValues(reason)); n != want {
			t.Errorf("refused %s counted %v, want %v", reason, n, want)
		}
	}
	if logs := h.logs.String(); !strings.Contains(logs, "refused REGISTER_KV_CACHE") || !strings.Contains(logs, "kv wrapper pickle refused") {
		t.Fatalf("the refused pickle is not logged:\n%s", logs)
	}
}
