package mq_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/gpucheck"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/kvcopy/kvcopytest"
	"github.com/lmcache-go/lmcache/internal/kvcuda"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestLMDCUDAFakeDriver: through the real ZMQ socket and engine, with the
// CUDA backend on kvcuda's fake driver (host memory standing in for the
// GPU): REGISTER_KV_CACHE with python-pickled CudaIPCWrappers opens the
// memory handles and pins the L1 pool; STORE waits on the worker's event
// and answers the server's completion event handle; the objects (read by
// an engine-driven PREPARE_RETRIEVE) are byte-exact; RETRIEVE writes the
// blocks byte-exact; UNREGISTER_KV_CACHE closes every handle and the
// server's stop unpins the pool. No GPU is involved.
func TestLMDCUDAFakeDriver(t *testing.T) {
	f := kvcuda.NewFake()
	h := start(t, opts{mq: func(c *mq.Config) { c.CUDA = f }})
	c := h.dial(mqclient.Options{})
	sched := h.dial(mqclient.Options{})

	pc := registerFakeCUDA(t, c, f, 7)
	if got := f.Open(); got != "mem=2 events=0 streams=1 pinned=1 ctx=1" {
		t.Fatalf("after registration: %s\n%s", got, h.logs.String())
	}

	tokens := prompt(3, 2*testChunk)
	ev, _ := f.WorkerEvent()
	reply := func(b []byte, err error) wire.TransferReply { t.Helper(); return transferReply(t, b, err) }
	k := wire.Marshal(key("m", 1, 0, tokens, 0, len(tokens), "r1"))
	r := reply(c.Call(wire.OpStore, k, wire.EncodeInt(7), blockIDs(5, 6, 1, 2), msgp.AppendBytes(nil, ev[:])))
	if !r.OK || len(r.Handle) != 64 || !bytes.HasPrefix(r.Handle, []byte("fakeevt")) {
		t.Fatalf("STORE reply %+v: want the server's completion event handle", r)
	}
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, len(tokens), "r1"), 2)
	log := f.Log()
	if strings.Join(log, "\n") == "" || indexIn(log, "StreamWaitEvent") > indexIn(log, "Memcpy") || indexIn(log, "Memcpy") < 0 {
		t.Fatalf("the store did not wait on the worker's event before copying:\n%s", strings.Join(log, "\n"))
	}

	w := h.worker(8, "m", 1, 0)
	want := [][]byte{pc.object([]int{5, 6}), pc.object([]int{1, 2})}
	if !w.retrieve(tokens, 0, 2*testChunk, "r1", func(c int) []byte { return want[c] }) {
		t.Fatal("engine-driven PREPARE_RETRIEVE of CUDA-stored objects failed")
	}

	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, len(tokens), "r2"), 2)
	k = wire.Marshal(key("m", 1, 0, tokens, 0, len(tokens), "r2"))
	r = reply(c.Call(wire.OpRetrieve, k, wire.EncodeInt(7), blockIDs(9, 10, 11, 12), msgp.AppendBytes(nil, nil), wire.EncodeInt(0)))
	if !r.OK || len(r.Handle) != 64 {
		t.Fatalf("RETRIEVE reply %+v", r)
	}
	// The copies run when the server's completion goroutine waits on the
	// event (the fake runs the stream there, under its lock, so reading
	// the log orders this test's reads after them).
	waitFor(t, "the retrieve's completion", func() bool { return f.Count("EventSynchronize") == 2 })
	src, dst := []int{5, 6, 1, 2}, []int{9, 10, 11, 12}
	for kv := range 2 {
		for l := range testLayers {
			for tok := range 2 * testChunk {
				if !bytes.Equal(pc.row(kv, l, dst[tok/pcBS], tok%pcBS), pc.row(kv, l, src[tok/pcBS], tok%pcBS)) {
					t.Fatalf("kv %d layer %d token %d: retrieved row differs", kv, l, tok)
				}
			}
		}
	}

	// Both copies are counted under the CUDA path once they completed.
	tm := h.srv.Metrics()
	waitFor(t, "the retrieve counted", func() bool {
		return counterValue(tm.TransferBytes.WithLabelValues("retrieve", "lmcache_driven_cuda")) == 2*testObj
	})
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"store bytes", counterValue(tm.TransferBytes.WithLabelValues("store", "lmcache_driven_cuda")), 2 * testObj},
		{"store chunks", counterValue(tm.TransferChunks.WithLabelValues("store", "lmcache_driven_cuda")), 2},
		{"retrieve chunks", counterValue(tm.TransferChunks.WithLabelValues("retrieve", "lmcache_driven_cuda")), 2},
		{"CPU store bytes", counterValue(tm.TransferBytes.WithLabelValues("store", "lmcache_driven_cpu")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s counted %v, want %v", c.name, c.got, c.want)
		}
	}

	// POST /cache/checksums reads CPU caches only: 501 for this one.
	if _, err := h.srv.KVLayers(7); err == nil || !strings.Contains(err.Error(), "CUDA KV cache") {
		t.Fatalf("KVLayers of a CUDA context = %v", err)
	} else if !errors.Is(err, httpapi.ErrUnsupported) {
		t.Fatalf("KVLayers of a CUDA context: %v does not wrap httpapi.ErrUnsupported (501)", err)
	}
	if b, err := c.Call(wire.OpUnregisterKVCache, wire.EncodeInt(7)); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("UNREGISTER_KV_CACHE = %x %v", b, err)
	}
	if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=1 ctx=0" {
		t.Fatalf("after UNREGISTER_KV_CACHE: %s", got)
	}
	// An instance with no registration is httpapi's not-found (404).
	if _, err := h.srv.KVLayers(7); !errors.Is(err, httpapi.ErrNotFound) {
		t.Fatalf("KVLayers after UNREGISTER_KV_CACHE = %v, want one wrapping httpapi.ErrNotFound", err)
	}
	h.stop()
	if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=0 ctx=0" {
		t.Fatalf("after the server stopped: %s", got)
	}
}

// registerFakeCUDA REGISTER_KV_CACHEs instance inst with a [2, 16, 8, 4,
// 16] fp16 NHD cache per layer in f's "device" memory (random bytes),
// python-pickled CudaIPCWrappers, and returns the cache.
func registerFakeCUDA(t *testing.T, c *mqclient.Client, f *kvcuda.Fake, inst int64) *pagedCache {
	t.Helper()
	n := 2 * pcBlocks * pcBS * pcHeads * pcHS * 2
	rnd := rand.New(rand.NewPCG(8, 8))
	pc := &pagedCache{}
	var specs []map[string]any
	for range testLayers {
		m := make([]byte, n)
		for i := range m {
			m[i] = byte(rnd.Uint32())
		}
		hd := f.ExportMem(m)
		pc.maps = append(pc.maps, m)
		specs = append(specs, map[string]any{"mem": hex.EncodeToString(hd[:]), "event": hex.EncodeToString(make([]byte, 64)), "nbytes": n, "dtype": "float16", "uuid": f.UUID,
			"shape":  []int{2, pcBlocks, pcBS, pcHeads, pcHS},
			"stride": []int{pcBlocks * pcBS * pcHeads * pcHS, pcBS * pcHeads * pcHS, pcHeads * pcHS, pcHS, 1}})
	}
	frames := kvcopytest.RegisterFrames(inst, kvcopytest.Wrappers(t, gpucheck.CUDAPickler, specs), "m", 1, "NHD", 0)
	if b, err := c.Call(wire.OpRegisterKVCache, frames...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
	}
	return pc
}

// transferReply decodes a STORE or RETRIEVE reply.
func transferReply(t *testing.T, b []byte, err error) wire.TransferReply {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var r wire.TransferReply
	if err := wire.Unmarshal(b, &r); err != nil {
		t.Fatalf("reply %x: %v", b, err)
	}
	return r
}

func indexIn(log []string, prefix string) int {
	for i, l := range log {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}
