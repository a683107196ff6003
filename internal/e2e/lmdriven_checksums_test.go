package e2e

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvcopy/kvcopytest"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// hndCache is a worker's HND paged KV cache in /dev/shm, one segment per
// layer: [2, hndBlocks, hndHeads, hndBS, hndHS] float16 of random bytes.
type hndCache struct {
	names []string
	maps  [][]byte
}

const (
	hndLayers = 2
	hndBlocks = 16
	hndHeads  = 4
	hndBS     = 8
	hndHS     = 16
	// hndKV is the bytes of one block's K (or V) part in a layer.
	hndKV = hndHeads * hndBS * hndHS * 2
)

func newHNDCache(t *testing.T) *hndCache {
	t.Helper()
	hc := &hndCache{}
	r := rand.New(rand.NewPCG(4, 12))
	for range hndLayers {
		name, m := kvcopytest.Segment(t, "e2e", 2*hndBlocks*hndKV, r)
		hc.names, hc.maps = append(hc.names, name), append(hc.maps, m)
	}
	return hc
}

// registerFrames are REGISTER_KV_CACHE's payload frames for instance inst
// of model m, world size 1, with the HND layout hints.
func (hc *hndCache) registerFrames(t *testing.T, inst int64) [][]byte {
	t.Helper()
	var specs []map[string]any
	for _, n := range hc.names {
		specs = append(specs, map[string]any{"name": "/" + n, "nbytes": 2 * hndBlocks * hndKV,
			"shape":  []int{2, hndBlocks, hndHeads, hndBS, hndHS},
			"stride": []int{hndBlocks * hndKV / 2, hndKV / 2, hndBS * hndHS, hndHS, 1}})
	}
	return kvcopytest.RegisterFrames(inst, kvcopytest.Wrappers(t, kvcopytest.CPUShmPickler, specs), "m", 1, "HND", hndBS)
}

// block is block b of layer l as /cache/checksums defines it: its K part
// then its V part, as stored.
func (hc *hndCache) block(l, b int) []byte {
	m := hc.maps[l]
	k, v := b*hndKV, (hndBlocks+b)*hndKV
	return append(append([]byte(nil), m[k:k+hndKV]...), m[v:v+hndKV]...)
}

// md5Of is the hex MD5 over layers × blocks, layer-major.
func (hc *hndCache) md5Of(layers, blocks []int) string {
	h := md5.New()
	for _, l := range layers {
		for _, b := range blocks {
			h.Write(hc.block(l, b))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestLMDChecksumsThroughBinary: the real `lmcache server` process with
// --supported-transfer-mode lmcache_driven; a worker registers an HND
// CPU shared-memory KV cache through the real ZMQ socket (python-pickled
// CpuShmTensorWrappers), STOREs two chunks from blocks 5, 6, 1, 2 and
// RETRIEVEs them into blocks 9-12. POST /cache/checksums over HTTP then
// answers, for both block lists, the MD5 values this test computes from
// the segments (aggregated over layers and layerwise), the same values
// for the source and the retrieved blocks; an unknown instance is a 404
// (also after UNREGISTER_KV_CACHE), a block id past the cache, an empty
// block list and a chunk size of 0 are 400s.
func TestLMDChecksumsThroughBinary(t *testing.T) {
	httpPort, zmqPort := freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	shm := fmt.Sprintf("lmdsum_%d", os.Getpid())
	t.Cleanup(func() { _ = os.Remove("/dev/shm/lmcache_l1_pool_" + shm) })
	start(t, "lmd-server", nil, "server", "--http-port", itoa(httpPort), "--port", itoa(zmqPort),
		"--chunk-size", itoa(chunkSize), "--l1-size-gb", "0.0625", "--shm-name", shm, "--supported-transfer-mode", "lmcache_driven")
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))

	c, err := mqclient.Dial("tcp://127.0.0.1:"+itoa(zmqPort), mqclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hc := newHNDCache(t)
	if b, err := c.Call(wire.OpRegisterKVCache, hc.registerFrames(t, 7)...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
	}

	toks := make([]wire.Int, 2*chunkSize)
	for i := range toks {
		toks[i] = wire.Int(900 + 7*i)
	}
	key := func(worker int64, reqID string) *wire.Key {
		k := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: toks, End: wire.Int(len(toks)), RequestID: reqID, NumKVReaders: 1}
		if worker >= 0 {
			k.WorkerID = wire.SomeInt(worker)
		}
		return k
	}
	ids := func(bs ...int) []byte {
		b := msgp.AppendArrayHeader(nil, 1)
		b = msgp.AppendArrayHeader(b, uint32(len(bs)))
		for _, id := range bs {
			b = msgp.AppendInt(b, id)
		}
		return b
	}
	ok := []byte{0x92, 0xc4, 0x00, 0xc3} // [b"", true]
	// lookup locks the prompt's chunks for a RETRIEVE and returns the hits.
	lookup := func(reqID string) int {
		t.Helper()
		k := key(-1, reqID)
		if err := c.Lookup(k, 1); err != nil {
			t.Fatal(err)
		}
		n, ready, err := c.WaitPrefetchStatus(reqID, 10*time.Second)
		if err != nil || !ready {
			t.Fatalf("WAIT_PREFETCH_STATUS = %d %v %v", n, ready, err)
		}
		return n
	}
	src, dst := []int{5, 6, 1, 2}, []int{9, 10, 11, 12}
	if b, err := c.Call(wire.OpStore, wire.Marshal(key(0, "s")), wire.EncodeInt(7), ids(src...), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, ok) {
		t.Fatalf("STORE = %x %v", b, err)
	}
	if n := lookup("r"); n != 2 {
		t.Fatalf("LOOKUP right after the STORE reply hit %d chunks, want 2", n)
	}
	if b, err := c.Call(wire.OpRetrieve, wire.Marshal(key(0, "r")), wire.EncodeInt(7), ids(dst...), msgp.AppendBytes(nil, nil), wire.EncodeInt(0)); err != nil || !bytes.Equal(b, ok) {
		t.Fatalf("RETRIEVE = %x %v", b, err)
	}

	type checksums struct {
		Status         string          `json:"status"`
		ChunkSize      int             `json:"chunk_size"`
		NumChunks      int             `json:"num_chunks"`
		ChunkChecksums json.RawMessage `json:"chunk_checksums"`
		Layerwise      bool            `json:"layerwise"`
		BlockIDRanges  string          `json:"block_id_ranges"`
		Detail         string          `json:"detail"` // an error's message
	}
	post := func(body map[string]any) (int, checksums) {
		t.Helper()
		var out checksums
		code, _ := call(t, "POST", base+"/cache/checksums", body, nil, &out)
		return code, out
	}
	both := []int{0, 1}
	for _, blocks := range [][]int{src, dst} {
		code, res := post(map[string]any{"instance_id": 7, "block_ids": blocks, "chunk_size": 2})
		var got []string
		if err := json.Unmarshal(res.ChunkChecksums, &got); code != http.StatusOK || err != nil {
			t.Fatalf("POST /cache/checksums %v = %d %+v (%v)", blocks, code, res, err)
		}
		// The retrieved blocks hold the source blocks' bytes, so both lists
		// hash to the values of the source blocks.
		want := []string{hc.md5Of(both, src[:2]), hc.md5Of(both, src[2:])}
		if fmt.Sprint(got) != fmt.Sprint(want) || res.Status != "success" || res.NumChunks != 2 || res.ChunkSize != 2 || res.Layerwise {
			t.Fatalf("checksums of %v = %+v %v, want %v", blocks, res, got, want)
		}
		code, res = post(map[string]any{"instance_id": 7, "block_ids": blocks, "chunk_size": 3, "layerwise": true})
		var lw map[string][]string
		if err := json.Unmarshal(res.ChunkChecksums, &lw); code != http.StatusOK || err != nil || !res.Layerwise || res.NumChunks != 2 {
			t.Fatalf("layerwise POST /cache/checksums %v = %d %+v (%v)", blocks, code, res, err)
		}
		if len(lw) != hndLayers {
			t.Fatalf("layerwise checksums for %d layers: %v", len(lw), lw)
		}
		for l := range hndLayers {
			want := []string{hc.md5Of([]int{l}, src[:3]), hc.md5Of([]int{l}, src[3:])}
			if got := lw[fmt.Sprintf("layer_%d", l)]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("layer_%d checksums of %v = %v, want %v", l, blocks, got, want)
			}
		}
	}
	if code, res := post(map[string]any{"instance_id": 7, "block_ids": []int{0, 1, 2, 5, 6}, "chunk_size": 5}); code != http.StatusOK || res.BlockIDRanges != "[0,2],[5,6]" {
		t.Fatalf("block_id_ranges of 0,1,2,5,6 = %d %q", code, res.BlockIDRanges)
	}

	for _, tc := range []struct {
		body map[string]any
		code int
	}{
		{map[string]any{"instance_id": 8, "block_ids": []int{0}, "chunk_size": 1}, http.StatusNotFound},
		{map[string]any{"instance_id": 7, "block_ids": []int{hndBlocks}, "chunk_size": 1}, http.StatusBadRequest},
		{map[string]any{"instance_id": 7, "block_ids": []int{}, "chunk_size": 1}, http.StatusBadRequest},
		{map[string]any{"instance_id": 7, "block_ids": []int{0}, "chunk_size": 0}, http.StatusBadRequest},
	} {
		if code, res := post(tc.body); code != tc.code || res.Detail == "" {
			t.Errorf("POST /cache/checksums %v = %d %+v, want %d with a detail", tc.body, code, res, tc.code)
		}
	}
	if b, err := c.Call(wire.OpUnregisterKVCache, wire.EncodeInt(7)); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("UNREGISTER_KV_CACHE = %x %v", b, err)
	}
	if code, res := post(map[string]any{"instance_id": 7, "block_ids": []int{0}, "chunk_size": 1}); code != http.StatusNotFound {
		t.Fatalf("checksums after UNREGISTER_KV_CACHE = %d %+v, want 404", code, res)
	}
}
