// Package gpucheck is a stand-in vLLM worker for checking the
// lmcache-driven CUDA path on a GPU machine: it allocates a paged KV cache
// (NHD or MLA) with cuMemAlloc, exports its CUDA IPC memory handles and an
// IPC event, registers it with a running `lmcache server` over ZMQ
// (REGISTER_KV_CACHE with CudaIPCWrapper pickles), stores every block,
// scrambles the cache, retrieves it back, checks it byte-exact, and
// prints store and retrieve GB/s beside a raw device-to-host and
// host-to-device copy of the same bytes measured in the same run.
//
// Without a GPU it runs on kvcuda.Fake (Config.Fake): the worker and an
// in-process server share the fake, so the flow is rehearsed end to end
// over a real ZMQ socket, but no figure it prints says anything about a
// GPU.
package gpucheck

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"strings"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvcuda"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// Config is one check run.
type Config struct {
	// Endpoint is the server's ZMQ endpoint.
	Endpoint string
	// Layout is "nhd" or "mla".
	Layout string
	// Bytes is the KV cache size to allocate (rounded down to whole
	// chunks).
	Bytes int64
	// Layers of the model (32 by default).
	Layers int
	// Python runs the wrapper pickler (python3 by default).
	Python string
	// Out receives the report.
	Out io.Writer
}

// Result is what a run measured.
type Result struct {
	Bytes                   int64
	StoreGBs, RetrieveGBs   float64
	RawD2HGBs, RawH2DGBs    float64
	StoreRatio, RetrieveRat float64
}

// geometry is the paged cache: per layer [2, nb, bs, nh, hs] (NHD) or
// [nb, bs, latent] (MLA), bf16.
type geometry struct {
	mla            bool
	nl, nb, bs     int64
	nh, hs, latent int64
}

func (g geometry) layerBytes() int64 {
	if g.mla {
		return g.nb * g.bs * g.latent * 2
	}
	return 2 * g.nb * g.bs * g.nh * g.hs * 2
}

func (g geometry) shape() ([]int64, []int64) {
	if g.mla {
		return []int64{g.nb, g.bs, g.latent}, []int64{g.bs * g.latent, g.latent, 1}
	}
	return []int64{2, g.nb, g.bs, g.nh, g.hs}, []int64{g.nb * g.bs * g.nh * g.hs, g.bs * g.nh * g.hs, g.nh * g.hs, g.hs, 1}
}

// PicklerPrelude sets up stand-in modules and torch dtype globals that
// pickle by name, as upstream's classes and torch's dtypes do (python3).
const PicklerPrelude = `
import json, pickle, sys, types
def mod(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    return sys.modules[name]
class Dtype:
    __module__ = "torch"
    def __init__(self, n): self.n = n
    def __reduce__(self): return self.n
torch = mod("torch")
for n in ("float16", "bfloat16"):
    setattr(torch, n, Dtype(n))
def stub(module, name):
    m = mod(module)
    W = type(name, (object,), {})
    W.__module__ = m.__name__
    setattr(m, name, W)
    return W
`

// CUDAPickler prints one CudaIPCWrapper pickle (hex) per JSON tensor
// spec in argv[1] ({mem, event: hex handles; nbytes; dtype; shape;
// stride; uuid}): the wrapper torch's side produces, with the 8-tuple
// handle of UntypedStorage._share_cuda_(). The GPU machine has Python;
// the classes are stand-ins carrying upstream's module and class names.
const CUDAPickler = PicklerPrelude + `
W = stub("lmcache.v1.multiprocess.custom_types", "CudaIPCWrapper")
for t in json.loads(sys.argv[1]):
    w = W.__new__(W)
    h = (0, bytes.fromhex(t["mem"]), t["nbytes"], 0, b"/torch_refcount", 0, bytes.fromhex(t["event"]), True)
    w.__dict__.update(handle=h, dtype=getattr(torch, t["dtype"]), shape=tuple(t["shape"]), stride=tuple(t["stride"]),
        storage_offset=0, device_uuid=t["uuid"])
    print(pickle.dumps(w, protocol=4).hex())
`

// Run performs the check on dev against the server at cfg.Endpoint.
func Run(cfg Config, dev Device) (*Result, error) {
	if cfg.Layers == 0 {
		cfg.Layers = 32
	}
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	c, err := mqclient.Dial(cfg.Endpoint, mqclient.Options{Timeout: 120 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", cfg.Endpoint, err)
	}
	defer c.Close()
	chunk, err := c.GetChunkSize()
	if err != nil {
		return nil, fmt.Errorf("GET_CHUNK_SIZE: %w", err)
	}
	g := geometry{mla: cfg.Layout == "mla", nl: int64(cfg.Layers), bs: 16, nh: 8, hs: 128, latent: 576}
	if cfg.Layout != "nhd" && cfg.Layout != "mla" {
		return nil, fmt.Errorf("layout %q: want nhd or mla", cfg.Layout)
	}
	if int64(chunk)%g.bs != 0 {
		return nil, fmt.Errorf("server chunk size %d is not a multiple of the block size %d", chunk, g.bs)
	}
	bpc := int64(chunk) / g.bs
	g.nb = 1
	per := g.layerBytes() * g.nl // bytes per block over all layers
	g.nb = cfg.Bytes / per / bpc * bpc
	if g.nb < bpc {
		return nil, fmt.Errorf("%d bytes hold less than one %d-token chunk", cfg.Bytes, chunk)
	}
	total := g.layerBytes() * g.nl
	fmt.Fprintf(cfg.Out, "layout %s: %d layers x %d blocks x %d tokens, %.2f GiB of KV cache, chunk %d tokens, device %s\n",
		cfg.Layout, g.nl, g.nb, g.bs, float64(total)/(1<<30), chunk, dev.UUID())

	// Allocate and fill every layer; keep the host copy to compare with.
	rnd := rand.New(rand.NewPCG(7, uint64(total)))
	want := make([][]byte, g.nl)
	bufs := make([]Buffer, g.nl)
	for l := range want {
		want[l] = make([]byte, g.layerBytes())
		for i := 0; i+8 <= len(want[l]); i += 8 {
			v := rnd.Uint64()
			for k := range 8 {
				want[l][i+k] = byte(v >> (8 * k))
			}
		}
		if bufs[l], err = dev.Alloc(g.layerBytes()); err != nil {
			return nil, fmt.Errorf("allocate layer %d: %w", l, err)
		}
		defer dev.Free(bufs[l])
		if err := dev.Upload(bufs[l], want[l]); err != nil {
			return nil, err
		}
	}
	res := &Result{Bytes: total}
	// Raw copies of the same bytes, for the ratios.
	if res.RawD2HGBs, res.RawH2DGBs, err = dev.RawCopy(bufs, g.layerBytes()); err != nil {
		return nil, err
	}
	// The raw copy wrote one buffer's bytes into all: restore them.
	for l, b := range bufs {
		if err := dev.Upload(b, want[l]); err != nil {
			return nil, err
		}
	}
	ready, err := dev.ReadyEvent()
	if err != nil {
		return nil, err
	}

	// REGISTER_KV_CACHE.
	shape, stride := g.shape()
	var specs []map[string]any
	for _, b := range bufs {
		h := b.Handle()
		specs = append(specs, map[string]any{"mem": hex.EncodeToString(h[:]), "event": hex.EncodeToString(ready[:]), "nbytes": g.layerBytes(), "dtype": "bfloat16",
			"uuid": dev.UUID(), "shape": shape, "stride": stride})
	}
	arg, _ := json.Marshal(specs)
	out, err := exec.Command(cfg.Python, "-c", CUDAPickler, string(arg)).Output()
	if err != nil {
		return nil, fmt.Errorf("%s pickler: %w", cfg.Python, err)
	}
	lines := strings.Fields(string(out))
	kv := msgp.AppendArrayHeader(nil, uint32(len(lines)))
	for _, l := range lines {
		p, err := hex.DecodeString(l)
		if err != nil {
			return nil, err
		}
		if kv, err = msgp.AppendExtension(kv, &msgp.RawExtension{Type: 1, Data: p}); err != nil {
			return nil, err
		}
	}
	hints := msgp.AppendMapHeader(nil, 2)
	hints = msgp.AppendString(hints, "kv_layout")
	hints = msgp.AppendString(hints, "NHD")
	hints = msgp.AppendString(hints, "tokens_per_block")
	hints = msgp.AppendInt64(hints, g.bs)
	const inst, model = 4242, "gpucheck/model"
	if b, err := c.Call(wire.OpRegisterKVCache, wire.EncodeInt(inst), kv, msgp.AppendString(nil, model), wire.EncodeInt(1),
		msgp.AppendString(nil, "vllm"), hints, wire.EmptyList); err != nil || !bytes.Equal(b, wire.Nil) {
		return nil, fmt.Errorf("REGISTER_KV_CACHE = %x %v", b, err)
	}
	defer c.Call(wire.OpUnregisterKVCache, wire.EncodeInt(inst))

	// Requests of 16 chunks over a shuffled block table.
	perm := rnd.Perm(int(g.nb))
	const chunksPerReq = 16
	type req struct {
		tokens   []wire.Int
		blocks   []int
		lookupID string // the LOOKUP whose read locks the retrieve uses
	}
	var reqs []req
	for b := 0; b < len(perm); b += chunksPerReq * int(bpc) {
		e := min(len(perm), b+chunksPerReq*int(bpc))
		toks := make([]wire.Int, (e-b)*int(g.bs))
		for i := range toks {
			toks[i] = wire.Int(rnd.IntN(150000))
		}
		reqs = append(reqs, req{tokens: toks, blocks: perm[b:e]})
	}
	key := func(r req, id string) *wire.Key {
		return &wire.Key{ModelName: model, WorldSize: 1, WorkerID: wire.SomeInt(0), TokenIDs: r.tokens, Start: 0, End: wire.Int(len(r.tokens)), RequestID: id, NumKVReaders: 1}
	}
	blockIDs := func(ids []int) []byte {
		b := msgp.AppendArrayHeader(nil, 1)
		b = msgp.AppendArrayHeader(b, uint32(len(ids)))
		for _, id := range ids {
			b = msgp.AppendInt(b, id)
		}
		return b
	}
	transfer := func(op wire.Op, frames ...[]byte) error {
		b, err := c.Call(op, frames...)
		if err != nil {
			return err
		}
		var r wire.TransferReply
		if err := wire.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s reply %x: %w", op.EnumName(), b, err)
		}
		if !r.OK {
			return fmt.Errorf("%s answered ok=false (see the server log)", op.EnumName())
		}
		if len(r.Handle) == 0 {
			return nil
		}
		var h kvcuda.IPCHandle
		copy(h[:], r.Handle)
		return dev.Wait(h)
	}

	t0 := time.Now()
	for i, r := range reqs {
		k := wire.Marshal(key(r, fmt.Sprintf("gpucheck-store-%d", i)))
		if err := transfer(wire.OpStore, k, wire.EncodeInt(inst), blockIDs(r.blocks), msgp.AppendBytes(nil, ready[:])); err != nil {
			return nil, fmt.Errorf("STORE %d: %w", i, err)
		}
	}
	storeT := time.Since(t0)

	// LOOKUP (and so prefetch-lock) everything, then scramble the cache.
	// The server commits a CUDA store once its completion event fired, on
	// its own goroutine, so a LOOKUP right after the worker saw the event
	// can come first: a short LOOKUP is retried (its locks freed) for up
	// to 10 s before it counts as a failure.
	for i, r := range reqs {
		want := len(r.blocks) / int(bpc)
		deadline := time.Now().Add(10 * time.Second)
		for try := 0; ; try++ {
			k := key(r, fmt.Sprintf("gpucheck-load-%d-%d", i, try))
			k.WorkerID = wire.OptInt{}
			n, err := c.LookupWait(k, time.Millisecond)
			if err != nil {
				return nil, fmt.Errorf("LOOKUP %d: %w", i, err)
			}
			if n == want {
				reqs[i].lookupID = k.RequestID
				break
			}
			if n > 0 {
				if err := c.FreeLookupLocks(k, 1); err != nil {
					return nil, fmt.Errorf("FREE_LOOKUP_LOCKS %d: %w", i, err)
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("LOOKUP %d hit %d of %d chunks for 10 s (is the server's L1 big enough for %d bytes?)", i, n, want, total)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	zero := make([]byte, g.layerBytes())
	for _, b := range bufs {
		if err := dev.Upload(b, zero); err != nil {
			return nil, err
		}
	}
	if ready, err = dev.ReadyEvent(); err != nil {
		return nil, err
	}
	t0 = time.Now()
	for i, r := range reqs {
		k := wire.Marshal(key(r, r.lookupID))
		if err := transfer(wire.OpRetrieve, k, wire.EncodeInt(inst), blockIDs(r.blocks), msgp.AppendBytes(nil, ready[:]), wire.EncodeInt(0)); err != nil {
			return nil, fmt.Errorf("RETRIEVE %d: %w", i, err)
		}
	}
	retrieveT := time.Since(t0)

	got := make([]byte, g.layerBytes())
	for l, b := range bufs {
		if err := dev.Download(got, b); err != nil {
			return nil, err
		}
		if !bytes.Equal(got, want[l]) {
			i := 0
			for i < len(got) && got[i] == want[l][i] {
				i++
			}
			return nil, fmt.Errorf("layer %d differs after the round trip (first at byte %d of %d: %x, want %x)", l, i, len(got), got[i:min(i+8, len(got))], want[l][i:min(i+8, len(got))])
		}
	}
	gbs := func(d time.Duration) float64 { return float64(total) / d.Seconds() / 1e9 }
	res.StoreGBs, res.RetrieveGBs = gbs(storeT), gbs(retrieveT)
	res.StoreRatio, res.RetrieveRat = res.StoreGBs/res.RawD2HGBs, res.RetrieveGBs/res.RawH2DGBs
	fmt.Fprintf(cfg.Out, "round trip byte-exact: %d bytes in %d requests\n", total, len(reqs))
	fmt.Fprintf(cfg.Out, "raw D2H %.2f GB/s, raw H2D %.2f GB/s\n", res.RawD2HGBs, res.RawH2DGBs)
	fmt.Fprintf(cfg.Out, "store %.2f GB/s (%.2f of raw D2H), retrieve %.2f GB/s (%.2f of raw H2D); goal 0.9\n",
		res.StoreGBs, res.StoreRatio, res.RetrieveGBs, res.RetrieveRat)
	return res, nil
}

// ErrNoGPU is returned where no CUDA driver or device is present.
var ErrNoGPU = errors.New("no GPU: libcuda.so.1 does not load or has no device")
