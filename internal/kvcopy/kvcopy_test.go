package kvcopy

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
	"github.com/lmcache-go/lmcache/internal/kvwrap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var segSeq atomic.Int64

// producer plays the client: it creates a paged KV cache in /dev/shm
// segments the way CpuShmTensorWrapper does (one per layer, or all layers
// as views at offsets of one segment) and describes it with wrappers.
type producer struct {
	format         string // "NHD", "HND" or "MLA"
	nl, nb, bs, nh int64
	hs, item       int64
	shared         bool

	names []string
	maps  [][]byte
	ws    []kvwrap.Wrapper
}

func (p *producer) shape() []int64 {
	switch p.format {
	case "NHD":
		return []int64{2, p.nb, p.bs, p.nh, p.hs}
	case "HND":
		return []int64{2, p.nb, p.nh, p.bs, p.hs}
	}
	return []int64{p.nb, p.bs, p.hs}
}

// elem is the element index of (kv, block, token, head, dim) within one
// layer's tensor, written out per format.
func (p *producer) elem(kv, b, t, h, d int64) int64 {
	switch p.format {
	case "NHD":
		return (((kv*p.nb+b)*p.bs+t)*p.nh+h)*p.hs + d
	case "HND":
		return (((kv*p.nb+b)*p.nh+h)*p.bs+t)*p.hs + d
	}
	return (b*p.bs+t)*p.hs + d
}

func (p *producer) layerElems() int64 {
	n := int64(1)
	for _, s := range p.shape() {
		n *= s
	}
	return n
}

func create(t testing.TB, n int64) (string, []byte) {
	t.Helper()
	name := fmt.Sprintf("lmcache_kv_gotest_%d_%d", os.Getpid(), segSeq.Add(1))
	path := filepath.Join(DefaultDir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatalf("create %s: %v", path, err)
	}
	defer unix.Close(fd)
	t.Cleanup(func() { _ = os.Remove(path) })
	if err := unix.Ftruncate(fd, n); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
	return name, m
}

func (p *producer) build(t testing.TB, r *rand.Rand) {
	t.Helper()
	shape := p.shape()
	stride := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i] = acc
		acc *= shape[i]
	}
	span := p.layerElems() * p.item
	dtype := map[int64]string{1: "float8_e4m3fn", 2: "bfloat16", 4: "float32"}[p.item]
	if p.shared {
		name, m := create(t, span*p.nl)
		p.names, p.maps = []string{name}, [][]byte{m}
	}
	for l := range p.nl {
		w := kvwrap.Wrapper{Kind: kvwrap.KindCPUShm, Dtype: dtype, ItemSize: p.item, Shape: shape, Stride: stride, DeviceUUID: "cpu"}
		if p.shared {
			w.ShmName, w.NBytes, w.StorageOffset = "/"+p.names[0], span*p.nl, l*p.layerElems()
		} else {
			name, m := create(t, span)
			p.names, p.maps = append(p.names, name), append(p.maps, m)
			w.ShmName, w.NBytes = "/"+name, span
		}
		p.ws = append(p.ws, w)
	}
	for _, m := range p.maps {
		for i := range m {
			m[i] = byte(r.Uint32())
		}
	}
}

// row is the bytes of one (kv, layer, block, token) row: heads × head
// size elements, in (head, dim) order as the L1 object stores them.
func (p *producer) row(kv, l, b, t int64) []byte {
	var out []byte
	seg, base := p.maps[0], l*p.layerElems()*p.item
	if !p.shared {
		seg, base = p.maps[l], 0
	}
	for h := range p.nh {
		o := base + p.elem(kv, b, t, h, 0)*p.item
		out = append(out, seg[o:o+p.hs*p.item]...)
	}
	return out
}

func (p *producer) nkv() int64 {
	if p.format == "MLA" {
		return 1
	}
	return 2
}

// object is the engine-driven object of a chunk by definition: KV_2LTD
// [2, layers, chunk, hidden] ([layers, chunk, latent] for MLA).
func (p *producer) object(blocks []int64) []byte {
	var out []byte
	for kv := range p.nkv() {
		for l := range p.nl {
			for _, b := range blocks {
				for t := range p.bs {
					out = append(out, p.row(kv, l, b, t)...)
				}
			}
		}
	}
	return out
}

func hints(p *producer) kvlayout.Hints {
	return kvlayout.Hints{KVLayout: p.format, TokensPerBlock: p.bs}
}

// TestCPUBackendRoundTrip: a Go producer's paged cache in /dev/shm
// segments (NHD, HND, MLA; per-layer or shared segments; world size 1
// and 2) is gathered into L1-layout objects equal to the engine-driven
// object definition, and scattered back into fresh blocks of another
// cache byte-exact, for a partial range (the store skips chunk 0 as
// already present; the retrieve starts at chunk 1) with
// skip_first_n_tokens leaving the first tokens of the range untouched.
func TestCPUBackendRoundTrip(t *testing.T) {
	const chunk = 16
	for _, format := range []string{"NHD", "HND", "MLA"} {
		for _, world := range []int64{1, 2} {
			for _, shared := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/ws%d/shared=%v", format, world, shared), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(world), uint64(len(format))))
					for rank := range world {
						roundTrip(t, r, format, world, rank, shared, chunk)
					}
				})
			}
		}
	}
}

func roundTrip(t *testing.T, r *rand.Rand, format string, world, rank int64, shared bool, chunk int64) {
	mk := func() *producer {
		p := &producer{format: format, nl: 3, nb: 12, bs: 8, nh: 4 / world, hs: 8, item: 2, shared: shared}
		if format == "MLA" { // every rank holds the whole latent
			p.nh, p.hs, p.item = 1, 24, 1
		}
		p.build(t, r)
		return p
	}
	src, dst := mk(), mk()
	reg := Registration{Engine: "vllm", Hints: hints(src)}
	cs, err := Open("", src.ws, reg)
	if err != nil {
		t.Fatalf("rank %d: Open: %v", rank, err)
	}
	defer cs.Close()
	if got, want := cs.Layout.Format.String(), format; got != want {
		t.Fatalf("rank %d: detected %s, want %s", rank, got, want)
	}
	bpc := chunk / src.bs
	// A 3-chunk store range; chunk 0 is "already present" and skipped.
	storeBlocks := []int64{7, 2, 3, 4, 11, 0}
	objBytes := cs.Layout.ObjectBytes(chunk)
	objs := [][]byte{make([]byte, objBytes), make([]byte, objBytes)}
	plan, err := cs.Layout.Plan(chunk, storeBlocks, []kvlayout.Chunk{{Index: 1, Obj: 0}, {Index: 2, Obj: 1}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Gather(plan, objs); err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for i, c := range []int{1, 2} {
		want := src.object(storeBlocks[int64(c)*bpc : int64(c+1)*bpc])
		if int64(len(want)) != objBytes || !bytes.Equal(objs[i], want) {
			t.Fatalf("rank %d: object of chunk %d differs from the KV_2LTD definition", rank, c)
		}
	}

	// Retrieve the range starting at chunk 1 into other blocks of another
	// cache, skipping the first 5 tokens (not block-aligned).
	cd, err := Open("", dst.ws, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer cd.Close()
	const skip = 5
	retrBlocks := []int64{9, 1, 5, 6}
	before := make([][]byte, len(dst.maps))
	for i, m := range dst.maps {
		before[i] = bytes.Clone(m)
	}
	plan, err = cd.Layout.Plan(chunk, retrBlocks, []kvlayout.Chunk{{Index: 0, Obj: 0}, {Index: 1, Obj: 1}}, skip)
	if err != nil {
		t.Fatal(err)
	}
	if err := cd.Scatter(plan, objs); err != nil {
		t.Fatalf("Scatter: %v", err)
	}
	for kv := range src.nkv() {
		for l := range src.nl {
			for tok := range 2 * chunk {
				bs, bd := storeBlocks[bpc+tok/src.bs], retrBlocks[tok/dst.bs]
				ts := tok % src.bs
				got := dst.row(kv, l, bd, ts)
				want := src.row(kv, l, bs, ts)
				if tok < skip {
					// Untouched: compare with the cache before the retrieve.
					saved := dst.maps
					dst.maps = before
					want = dst.row(kv, l, bd, ts)
					dst.maps = saved
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("rank %d kv %d layer %d token %d: retrieved row differs", rank, kv, l, tok)
				}
			}
		}
	}
	// Blocks outside the retrieve table are untouched: zero the written
	// rows in both copies and compare whole segments.
	var written int64
	for i := range dst.maps {
		written += int64(countDiff(before[i], dst.maps[i]))
	}
	if written > plan.Bytes {
		t.Fatalf("rank %d: %d bytes changed, the plan writes %d", rank, written, plan.Bytes)
	}
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

func TestOpenRefuses(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	p := &producer{format: "NHD", nl: 2, nb: 4, bs: 8, nh: 2, hs: 4, item: 2}
	p.build(t, r)
	reg := Registration{Hints: hints(p)}

	cuda := p.ws[0]
	cuda.Kind = kvwrap.KindCUDAIPC
	missing := p.ws[1]
	missing.ShmName = "/lmcache_kv_gotest_missing_segment"
	tooBig := p.ws[1]
	tooBig.NBytes *= 2
	escape := p.ws[1]
	escape.ShmName = "/../etc/passwd"
	short := p.ws[1]
	short.NBytes = 16
	cases := []struct {
		name string
		ws   []kvwrap.Wrapper
		want error
	}{
		{"CUDA wrapper", []kvwrap.Wrapper{cuda, p.ws[1]}, ErrNotCPU},
		{"missing segment", []kvwrap.Wrapper{p.ws[0], missing}, ErrSegment},
		{"segment smaller than declared", []kvwrap.Wrapper{p.ws[0], tooBig}, ErrSegment},
		{"view past the segment", []kvwrap.Wrapper{p.ws[0], short}, ErrSegment},
		{"name leaves the directory", []kvwrap.Wrapper{p.ws[0], escape}, kvwrap.ErrMalformed},
		{"no tensors", nil, kvlayout.ErrUnsupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Open("", c.ws, reg); !errors.Is(err, c.want) {
				t.Fatalf("Open error = %v, want %v", err, c.want)
			}
		})
	}
	if _, err := Open("", p.ws, Registration{Groups: 2}); !errors.Is(err, kvlayout.ErrHybrid) {
		t.Fatalf("hybrid registration: %v", err)
	}
}

// TestTruncatedSegmentFaultsCleanly: a client that shrinks its segment
// under the mapping makes the copy fail with ErrFault instead of killing
// the process with SIGBUS; Close after that works and copies then fail
// with ErrClosed.
func TestTruncatedSegmentFaultsCleanly(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	p := &producer{format: "NHD", nl: 1, nb: 64, bs: 16, nh: 8, hs: 64, item: 2}
	p.build(t, r)
	c, err := Open("", p.ws, Registration{Hints: hints(p)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(DefaultDir, p.names[0]), 0); err != nil {
		t.Fatal(err)
	}
	plan, err := c.Layout.Plan(16, []int64{63}, []kvlayout.Chunk{{Index: 0, Obj: 0}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	obj := [][]byte{make([]byte, c.Layout.ObjectBytes(16))}
	if err := c.Gather(plan, obj); !errors.Is(err, ErrFault) {
		t.Fatalf("Gather on a truncated segment: %v, want ErrFault", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Scatter(plan, obj); !errors.Is(err, ErrClosed) {
		t.Fatalf("Scatter after Close: %v, want ErrClosed", err)
	}
}
