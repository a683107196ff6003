package kvcuda

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
	"github.com/lmcache-go/lmcache/internal/kvwrap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gpuCache is a worker's NHD paged cache [2, nb, bs, nh, hs] bf16 per
// layer, in Fake "device" memory, described by CudaIPCWrappers.
type gpuCache struct {
	nl, nb, bs, nh, hs int64
	mems               [][]byte
	ws                 []kvwrap.Wrapper
}

func newGPUCache(t *testing.T, f *Fake, r *rand.Rand, nl, nb, bs, nh, hs int64) *gpuCache {
	t.Helper()
	g := &gpuCache{nl: nl, nb: nb, bs: bs, nh: nh, hs: hs}
	shape := []int64{2, nb, bs, nh, hs}
	stride := []int64{nb * bs * nh * hs, bs * nh * hs, nh * hs, hs, 1}
	n := 2 * nb * bs * nh * hs * 2
	for range nl {
		// 256 bytes before the storage: StorageOffsetBytes is honoured.
		m := make([]byte, 256+n)
		for i := range m {
			m[i] = byte(r.Uint32())
		}
		h := f.ExportMem(m)
		g.mems = append(g.mems, m)
		g.ws = append(g.ws, kvwrap.Wrapper{Kind: kvwrap.KindCUDAIPC, Dtype: "bfloat16", ItemSize: 2, Shape: shape, Stride: stride,
			DeviceUUID: f.UUID, CUDA: &kvwrap.CUDAHandle{MemHandle: h[:], StorageBytes: n, StorageOffsetBytes: 256}})
	}
	return g
}

// row is the bytes of (kv, layer, block, token): nh·hs elements.
func (g *gpuCache) row(kv, l, b, tok int64) []byte {
	n := g.nh * g.hs * 2
	o := 256 + ((kv*g.nb+b)*g.bs+tok)*n
	return g.mems[l][o : o+n]
}

// object is a chunk's KV_2LTD object by definition.
func (g *gpuCache) object(blocks []int64) []byte {
	var out []byte
	for kv := range int64(2) {
		for l := range g.nl {
			for _, b := range blocks {
				for tok := range g.bs {
					out = append(out, g.row(kv, l, b, tok)...)
				}
			}
		}
	}
	return out
}

// indexOf is the position of the first log line starting with prefix
// at or after from, or -1.
func indexOf(log []string, from int, prefix string) int {
	for i := from; i < len(log); i++ {
		if strings.HasPrefix(log[i], prefix) {
			return i
		}
	}
	return -1
}

func lastIndexOf(log []string, prefix string) int {
	for i := len(log) - 1; i >= 0; i-- {
		if strings.HasPrefix(log[i], prefix) {
			return i
		}
	}
	return -1
}

// TestStoreRetrieveOrdering: against the Fake, a store waits on the
// worker's event before any copy, records its completion event after the
// last copy, returns that event's IPC handle, and calls done only after
// the event completed, with the objects byte-exact KV_2LTD; a retrieve
// writes the blocks back byte-exact; Close waits, then closes every
// handle it opened.
func TestStoreRetrieveOrdering(t *testing.T) {
	f := NewFake()
	r := rand.New(rand.NewPCG(1, 2))
	g := newGPUCache(t, f, r, 3, 8, 4, 2, 16)
	c, err := Open(f, g.ws, Registration{Hints: kvlayout.Hints{KVLayout: "NHD"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Open(); got != "mem=3 events=0 streams=1 pinned=0 ctx=1" {
		t.Fatalf("after Open: %s", got)
	}
	const chunk = 8
	blocks := []int64{5, 2, 7, 0}
	objs := [][]byte{make([]byte, c.Layout.ObjectBytes(chunk)), make([]byte, c.Layout.ObjectBytes(chunk))}
	if err := Pin(f, objs[0]); err != nil {
		t.Fatal(err)
	}
	plan, err := c.Layout.Plan(chunk, blocks, []kvlayout.Chunk{{Index: 0, Obj: 0}, {Index: 1, Obj: 1}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	wait, _ := f.WorkerEvent()
	f.Gate = make(chan struct{})
	doneCh := make(chan error, 1)
	h, err := c.Submit(plan, objs, Store, wait[:], func(err error) { doneCh <- err })
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(h[:], []byte("fakeevt")) {
		t.Fatalf("returned handle %x is not the recorded event's", h[:8])
	}
	select {
	case err := <-doneCh:
		t.Fatalf("done ran before the completion event finished: %v", err)
	default:
	}
	if bytes.Equal(objs[0], g.object(blocks[:2])) {
		t.Fatal("objects filled before the stream ran")
	}
	close(f.Gate) // the stream runs
	if err := <-doneCh; err != nil {
		t.Fatal(err)
	}
	for i := range objs {
		if !bytes.Equal(objs[i], g.object(blocks[2*i:2*i+2])) {
			t.Fatalf("object %d differs from KV_2LTD", i)
		}
	}
	log := f.Log()
	wi := indexOf(log, 0, "StreamWaitEvent")
	c0 := indexOf(log, 0, "Memcpy")
	cN := lastIndexOf(log, "Memcpy")
	rec := indexOf(log, 0, "EventRecord")
	get := indexOf(log, 0, "IpcGetEventHandle")
	sync := indexOf(log, 0, "EventSynchronize")
	waited := indexOf(log, 0, "(stream) waited")
	copied := indexOf(log, 0, "(stream) copied")
	if !(wi >= 0 && wi < c0 && cN < rec && rec < get && get < sync && waited < copied && copied < sync) {
		t.Fatalf("call order wrong (wait %d, copies %d..%d, record %d, handle %d, sync %d):\n%s", wi, c0, cN, rec, get, sync, strings.Join(log, "\n"))
	}
	// One copy per (kv, layer, pair of consecutive blocks): NHD merges a
	// block's rows into one run.
	if n := f.Count("Memcpy"); n != len(plan.Runs) || n != 2*3*4 {
		t.Fatalf("%d copies enqueued for %d runs", n, len(plan.Runs))
	}

	// Retrieve into other blocks, leaving the first 3 tokens of the
	// range alone.
	dst := []int64{1, 3, 4, 6}
	before := bytes.Clone(g.row(0, 0, 1, 0))
	plan2, err := c.Layout.Plan(chunk, dst, []kvlayout.Chunk{{Index: 0, Obj: 0}, {Index: 1, Obj: 1}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	f.Gate = nil
	if _, err := c.Submit(plan2, objs, Retrieve, nil, func(err error) { doneCh <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-doneCh; err != nil {
		t.Fatal(err)
	}
	for kv := range int64(2) {
		for l := range g.nl {
			for tok := range int64(16) {
				got, want := g.row(kv, l, dst[tok/4], tok%4), g.row(kv, l, blocks[tok/4], tok%4)
				if tok < 3 {
					continue
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("kv %d layer %d token %d retrieved wrong", kv, l, tok)
				}
			}
		}
	}
	if !bytes.Equal(g.row(0, 0, 1, 0), before) {
		t.Fatal("a skipped token was written")
	}
	if n := f.Count("StreamWaitEvent"); n != 1 {
		t.Fatalf("an empty event handle was waited on (%d waits)", n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Unpin(f, objs[0]); err != nil {
		t.Fatal(err)
	}
	if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=0 ctx=0" {
		t.Fatalf("after Close: %s\n%s", got, strings.Join(f.Log(), "\n"))
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Submit(plan, objs, Store, nil, func(error) {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
}

// TestCloseWaitsForTransfers: Close does not release memory handles
// while a transfer is in flight.
func TestCloseWaitsForTransfers(t *testing.T) {
	f := NewFake()
	g := newGPUCache(t, f, rand.New(rand.NewPCG(3, 3)), 1, 4, 4, 1, 8)
	c, err := Open(f, g.ws, Registration{})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := c.Layout.Plan(4, []int64{2}, []kvlayout.Chunk{{Index: 0, Obj: 0}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	objs := [][]byte{make([]byte, c.Layout.ObjectBytes(4))}
	f.Gate = make(chan struct{})
	done := make(chan error, 1)
	if _, err := c.Submit(plan, objs, Store, nil, func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	// Close marks the cache closed before it waits; once it has, the
	// memory must stay open while the transfer is held at the gate.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		started := c.closed
		c.mu.Unlock()
		if started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Close did not start")
		}
		runtime.Gosched()
	}
	if got := f.Open(); !strings.HasPrefix(got, "mem=1 ") {
		t.Fatalf("memory closed while a transfer was in flight: %s", got)
	}
	close(f.Gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=0 ctx=0" {
		t.Fatalf("after Close: %s", got)
	}
}

// TestSubmitFailures: a bad plan or event handle enqueues nothing; a
// failing copy is waited for before Submit returns and done never runs.
func TestSubmitFailures(t *testing.T) {
	f := NewFake()
	g := newGPUCache(t, f, rand.New(rand.NewPCG(4, 4)), 1, 4, 4, 1, 8)
	c, err := Open(f, g.ws, Registration{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	plan, err := c.Layout.Plan(4, []int64{1, 2}, []kvlayout.Chunk{{Index: 0, Obj: 0}, {Index: 1, Obj: 1}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	never := func(error) { t.Error("done called for a failed Submit") }
	short := [][]byte{make([]byte, 10), make([]byte, 10)}
	if _, err := c.Submit(plan, short, Store, nil, never); !errors.Is(err, kvlayout.ErrBadRequest) {
		t.Fatalf("short objects: %v", err)
	}
	objs := [][]byte{make([]byte, c.Layout.ObjectBytes(4)), make([]byte, c.Layout.ObjectBytes(4))}
	if _, err := c.Submit(plan, objs, Store, make([]byte, 10), never); !errors.Is(err, kvlayout.ErrBadRequest) {
		t.Fatalf("10-byte event handle: %v", err)
	}
	if n := f.Count("Memcpy"); n != 0 {
		t.Fatalf("%d copies enqueued by refused submits", n)
	}
	f.FailCopy = errors.New("CUDA_ERROR_LAUNCH_FAILED")
	if _, err := c.Submit(plan, objs, Store, nil, never); err == nil || !strings.Contains(err.Error(), "LAUNCH_FAILED") {
		t.Fatalf("failing copy: %v", err)
	}
	log := f.Log()
	if i, j := lastIndexOf(log, "EventRecord"), lastIndexOf(log, "EventSynchronize"); i < 0 || j < i {
		t.Fatalf("a failed enqueue did not wait for the copies already enqueued:\n%s", strings.Join(log, "\n"))
	}
}

// TestOpenRefuses: CPU wrappers, unknown UUIDs, a view past its storage
// and a bad handle are refused, and nothing stays open.
func TestOpenRefuses(t *testing.T) {
	f := NewFake()
	g := newGPUCache(t, f, rand.New(rand.NewPCG(5, 5)), 2, 4, 4, 1, 8)
	mod := func(fn func(w []kvwrap.Wrapper)) []kvwrap.Wrapper {
		ws := slices.Clone(g.ws)
		for i := range ws {
			h := *ws[i].CUDA
			ws[i].CUDA = &h
		}
		fn(ws)
		return ws
	}
	for name, c := range map[string]struct {
		ws   []kvwrap.Wrapper
		want error
	}{
		"cpu":       {mod(func(w []kvwrap.Wrapper) { w[1].Kind = kvwrap.KindCPUShm }), ErrNotCUDA},
		"uuid":      {mod(func(w []kvwrap.Wrapper) { w[0].DeviceUUID, w[1].DeviceUUID = "GPU-1234", "GPU-1234" }), ErrNoDevice},
		"two uuids": {mod(func(w []kvwrap.Wrapper) { w[1].DeviceUUID = "GPU-1234" }), kvlayout.ErrUnsupported},
		"past":      {mod(func(w []kvwrap.Wrapper) { w[1].CUDA.StorageBytes = 100 }), kvwrap.ErrMalformed},
		// offset + extent wraps past 2^63 to a negative end below the size
		"wrapping end": {mod(func(w []kvwrap.Wrapper) {
			w[1].CUDA.StorageOffsetBytes, w[1].CUDA.StorageBytes = math.MaxInt64-10, 10
		}), kvwrap.ErrMalformed},
		"bad handle": {mod(func(w []kvwrap.Wrapper) { w[1].CUDA.MemHandle = make([]byte, 64) }), nil},
	} {
		if _, err := Open(f, c.ws, Registration{}); err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: Open = %v, want %v", name, err, c.want)
		}
		if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=0 ctx=0" {
			t.Fatalf("%s: left open: %s", name, got)
		}
	}
}

// TestUUIDForms: torch's "GPU-…" form, bare hex with dashes and upper
// case all name the same device.
func TestUUIDForms(t *testing.T) {
	u := [16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	s := UUIDString(u)
	if s != "GPU-deadbeef-0102-0304-0506-0708090a0b0c" {
		t.Fatalf("UUIDString = %s", s)
	}
	for _, v := range []string{s, strings.TrimPrefix(s, "GPU-"), strings.ToUpper(s), "deadbeef0102030405060708090a0b0c"} {
		if normUUID(v) != normUUID(s) {
			t.Errorf("%q does not match %q", v, s)
		}
	}
}

// TestLoadDriverWithoutCUDA: on a machine without libcuda.so.1 the load
// fails with ErrNoDriver; where a driver is installed it loads and answers
// a device count, so the test checks something on either machine.
func TestLoadDriverWithoutCUDA(t *testing.T) {
	d, err := LoadDriver()
	if err == nil {
		if n, cerr := d.DeviceCount(); cerr != nil || n < 0 {
			t.Fatalf("driver loaded but DeviceCount = %d, %v", n, cerr)
		}
		return
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("LoadDriver without CUDA: %v, want ErrNoDriver", err)
	}
}

// TestCompletionEventsBounded: a cache keeps the last keptEvents
// completion events alive for the worker to open, destroying older
// finished ones, and Close destroys the rest.
func TestCompletionEventsBounded(t *testing.T) {
	f := NewFake()
	g := newGPUCache(t, f, rand.New(rand.NewPCG(6, 6)), 1, 4, 4, 1, 8)
	c, err := Open(f, g.ws, Registration{})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := c.Layout.Plan(4, []int64{3}, []kvlayout.Chunk{{Index: 0, Obj: 0}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	objs := [][]byte{make([]byte, c.Layout.ObjectBytes(4))}
	done := make(chan error, 1)
	for range keptEvents + 44 {
		if _, err := c.Submit(plan, objs, Store, nil, func(err error) { done <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// The last completion goroutine marks its event finished just before
	// done; the next keep would trim it. 257 or fewer are alive.
	if got := f.Open(); got != "mem=1 events=256 streams=1 pinned=0 ctx=1" && got != "mem=1 events=257 streams=1 pinned=0 ctx=1" {
		t.Fatalf("after %d transfers: %s", keptEvents+44, got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := f.Open(); got != "mem=0 events=0 streams=0 pinned=0 ctx=0" {
		t.Fatalf("after Close: %s", got)
	}
}
