package kvlayout

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// dims are the logical sizes of a random paged cache.
type dims struct {
	f                      Format
	nl, nb, bs, nh, hs     int64
	item                   int64
	shared                 bool // all layers in one segment at offsets
	permuted               bool // strides of a permuted allocation
	layerGap, sharedOffset int64
}

// shapeOf is the tensor shape a format uses (one layer, or the single
// cross-layer tensor), written out literally per format so the reference
// below does not share the planner's stride bookkeeping.
func shapeOf(d dims) []int64 {
	switch d.f {
	case FormatNHD:
		return []int64{2, d.nb, d.bs, d.nh, d.hs}
	case FormatHND:
		return []int64{2, d.nb, d.nh, d.bs, d.hs}
	case FormatFlashInferNHD:
		return []int64{d.nb, 2, d.bs, d.nh, d.hs}
	case FormatFlashInferHND:
		return []int64{d.nb, 2, d.nh, d.bs, d.hs}
	case FormatFusedNHD:
		return []int64{d.nb, d.bs, d.nh, 2 * d.hs}
	case FormatFusedHND:
		return []int64{d.nb, d.nh, d.bs, 2 * d.hs}
	case FormatMLA:
		return []int64{d.nb, d.bs, d.hs}
	case FormatCrossLayerNHD:
		return []int64{d.nb, d.nl, 2, d.bs, d.nh, d.hs}
	case FormatCrossLayerHND:
		return []int64{d.nb, d.nl, 2, d.nh, d.bs, d.hs}
	}
	panic("format")
}

// refIndex is the index tuple of element (kv, layer, block, token, head,
// dim) in the format's tensor.
func refIndex(d dims, kv, l, b, t, h, x int64) []int64 {
	switch d.f {
	case FormatNHD:
		return []int64{kv, b, t, h, x}
	case FormatHND:
		return []int64{kv, b, h, t, x}
	case FormatFlashInferNHD:
		return []int64{b, kv, t, h, x}
	case FormatFlashInferHND:
		return []int64{b, kv, h, t, x}
	case FormatFusedNHD:
		return []int64{b, t, h, kv*d.hs + x}
	case FormatFusedHND:
		return []int64{b, h, t, kv*d.hs + x}
	case FormatMLA:
		return []int64{b, t, x}
	case FormatCrossLayerNHD:
		return []int64{b, l, kv, t, h, x}
	case FormatCrossLayerHND:
		return []int64{b, l, kv, h, t, x}
	}
	panic("format")
}

func crossLayer(f Format) bool { return f == FormatCrossLayerNHD || f == FormatCrossLayerHND }

// stridesFor returns strides for shape: row-major, or those of a buffer
// allocated with the axes in a random order and viewed back in shape's
// order (what a permuted, non-contiguous view looks like).
func stridesFor(r *rand.Rand, shape []int64, permuted bool) []int64 {
	order := make([]int, len(shape))
	for i := range order {
		order[i] = i
	}
	if permuted {
		r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	st := make([]int64, len(shape))
	acc := int64(1)
	for i := len(order) - 1; i >= 0; i-- {
		st[order[i]] = acc
		acc *= shape[order[i]]
	}
	return st
}

func numel(shape []int64) int64 {
	n := int64(1)
	for _, s := range shape {
		n *= s
	}
	return n
}

type cache struct {
	d       dims
	tensors []Tensor
	segs    [][]byte
}

func newCache(r *rand.Rand, d dims) cache {
	shape := shapeOf(d)
	stride := stridesFor(r, shape, d.permuted)
	span := numel(shape) * d.item
	c := cache{d: d}
	nt := d.nl
	if crossLayer(d.f) {
		nt = 1
	}
	if d.shared {
		seg := make([]byte, d.sharedOffset+nt*(span+d.layerGap))
		c.segs = [][]byte{seg}
		for i := range nt {
			c.tensors = append(c.tensors, Tensor{Dtype: "x", ItemSize: d.item, Shape: shape, Stride: stride,
				Segment: 0, BaseByte: d.sharedOffset + i*(span+d.layerGap)})
		}
	} else {
		for i := range nt {
			c.segs = append(c.segs, make([]byte, span))
			c.tensors = append(c.tensors, Tensor{Dtype: "x", ItemSize: d.item, Shape: shape, Stride: stride, Segment: int(i)})
		}
	}
	for _, s := range c.segs {
		fill(r, s)
	}
	return c
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// elemByte is the byte offset of an element of layer l in its segment.
func (c cache) elemByte(kv, l, b, t, h, x int64) (int, int64) {
	idx := refIndex(c.d, kv, l, b, t, h, x)
	ti := l
	if crossLayer(c.d.f) {
		ti = 0
	}
	tn := c.tensors[ti]
	off := int64(0)
	for i, v := range idx {
		off += v * tn.Stride[i]
	}
	return tn.Segment, tn.BaseByte + off*c.d.item
}

// refCopy is the naive element-by-element gather (store=true) or scatter.
func (c cache) refCopy(store bool, chunk int64, bids []int64, chunks []Chunk, skip int64, objs [][]byte) {
	d := c.d
	nkv, nh := int64(2), d.nh
	if d.f == FormatMLA {
		nkv, nh = 1, 1
	}
	bpc := chunk / d.bs
	for _, ch := range chunks {
		for kv := range nkv {
			for l := range d.nl {
				for tok := range chunk {
					if int64(ch.Index)*chunk+tok < skip {
						continue
					}
					b := bids[int64(ch.Index)*bpc+tok/d.bs]
					for h := range nh {
						for x := range d.hs {
							seg, so := c.elemByte(kv, l, b, tok%d.bs, h, x)
							var oo int64
							if d.f == FormatMLA {
								oo = ((l*chunk+tok)*d.hs + x) * d.item
							} else {
								oo = ((((kv*d.nl+l)*chunk+tok)*nh+h)*d.hs + x) * d.item
							}
							src, dst := c.segs[seg][so:so+d.item], objs[ch.Obj][oo:oo+d.item]
							if !store {
								src, dst = dst, src
							}
							copy(dst, src)
						}
					}
				}
			}
		}
	}
}

func cloneAll(bs [][]byte) [][]byte {
	out := make([][]byte, len(bs))
	for i, b := range bs {
		out[i] = bytes.Clone(b)
	}
	return out
}

var allFormats = []Format{FormatNHD, FormatHND, FormatFlashInferNHD, FormatFlashInferHND, FormatFusedNHD,
	FormatFusedHND, FormatMLA, FormatCrossLayerNHD, FormatCrossLayerHND}

func hintFor(f Format) string {
	switch f {
	case FormatHND, FormatFlashInferHND, FormatFusedHND, FormatCrossLayerHND:
		return "HND"
	}
	return "NHD"
}

func randomDims(r *rand.Rand) dims {
	d := dims{
		f:  allFormats[r.IntN(len(allFormats))],
		nl: 1 + r.Int64N(4), nb: 3 + r.Int64N(10), bs: 1 + r.Int64N(6), nh: 1 + r.Int64N(4), hs: 1 + r.Int64N(9),
		item:     []int64{1, 2, 4}[r.IntN(3)],
		shared:   r.IntN(2) == 0,
		permuted: r.IntN(3) == 0,
	}
	if d.shared {
		d.layerGap, d.sharedOffset = r.Int64N(3)*d.item, r.Int64N(4)*d.item
	}
	// Keep the detector's documented ambiguities out of the random set;
	// TestDetect covers them.
	if (d.f == FormatFlashInferHND || d.f == FormatFlashInferNHD) && d.nh == 1 {
		d.nh = 2
	}
	if d.f == FormatFlashInferHND && d.bs == 1 { // [NB,2,NH,1,HS] reads as a lone-head NHD
		d.bs = 2
	}
	if d.f == FormatMLA {
		d.nh = 1
	}
	return d
}

// TestPlanMatchesNaiveReference: on random formats, shapes, strides,
// segment sharing, block tables, chunk subsets and skip counts, the plan's
// gather and scatter produce exactly the bytes of an element-by-element
// reference.
func TestPlanMatchesNaiveReference(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 2026))
	for iter := range 400 {
		d := randomDims(r)
		c := newCache(r, d)
		l, err := Detect(Input{Tensors: c.tensors, Engine: "vllm", Hints: Hints{KVLayout: hintFor(d.f)}})
		if err != nil {
			t.Fatalf("iter %d %+v: Detect: %v", iter, d, err)
		}
		if l.Format != d.f {
			t.Fatalf("iter %d %+v: detected %v", iter, d, l.Format)
		}
		chunk := d.bs * (1 + r.Int64N(3))
		nchunks := 1 + r.IntN(3)
		bpc := chunk / d.bs
		bids := make([]int64, int64(nchunks)*bpc)
		for i := range bids {
			bids[i] = r.Int64N(d.nb)
		}
		if r.IntN(2) == 0 { // consecutive blocks, so runs merge across blocks
			base := r.Int64N(d.nb)
			for i := range bids {
				bids[i] = (base + int64(i)) % d.nb
			}
		}
		var chunks []Chunk
		for i := range nchunks {
			if r.IntN(4) != 0 || len(chunks) == 0 {
				chunks = append(chunks, Chunk{Index: i, Obj: len(chunks)})
			}
		}
		objBytes := l.ObjectBytes(chunk)
		objs := make([][]byte, len(chunks))
		for i := range objs {
			objs[i] = make([]byte, objBytes)
			fill(r, objs[i])
		}
		p, err := l.Plan(chunk, bids, chunks, 0)
		if err != nil {
			t.Fatalf("iter %d: Plan: %v", iter, err)
		}
		got, want := cloneAll(objs), cloneAll(objs)
		if err := p.Gather(c.segs, got); err != nil {
			t.Fatalf("iter %d: Gather: %v", iter, err)
		}
		c.refCopy(true, chunk, bids, chunks, 0, want)
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("iter %d %+v chunk %d: gathered object differs from reference", iter, d, i)
			}
		}
		if p.Bytes != int64(len(chunks))*objBytes {
			t.Fatalf("iter %d: plan copies %d bytes, want %d", iter, p.Bytes, int64(len(chunks))*objBytes)
		}

		// Scatter into a fresh cache state, honouring a random skip. With
		// repeated block ids the last writer wins in both implementations
		// because both walk chunks in the same order and rows in object
		// order.
		skip := r.Int64N(int64(nchunks)*chunk + 1)
		for i := range objs {
			fill(r, objs[i])
		}
		ps, err := l.Plan(chunk, bids, chunks, skip)
		if err != nil {
			t.Fatalf("iter %d: Plan(skip): %v", iter, err)
		}
		gotSegs, wantSegs := cloneAll(c.segs), cloneAll(c.segs)
		if err := ps.Scatter(gotSegs, objs); err != nil {
			t.Fatalf("iter %d: Scatter: %v", iter, err)
		}
		ref := c
		ref.segs = wantSegs
		ref.refCopy(false, chunk, bids, chunks, skip, objs)
		for i := range gotSegs {
			if !bytes.Equal(gotSegs[i], wantSegs[i]) {
				t.Fatalf("iter %d %+v skip %d seg %d: scattered cache differs from reference", iter, d, skip, i)
			}
		}
	}
}

// TestPlanCoalesces: NHD with consecutive blocks is one copy per (kv,
// layer) per request; HND one strided run per (kv, layer, block, head);
// formats whose blocks interleave K/V or layers one strided run per
// (kv, layer).
func TestPlanCoalesces(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, tc := range []struct {
		f    Format
		want int
	}{
		{FormatNHD, 2 * 3}, // 2 kv × 3 layers, 4 consecutive blocks merged
		// One strided run (8 tokens) per (kv, layer, block, head).
		{FormatHND, 2 * 3 * 4 * 2},
		{FormatMLA, 3},
		// Blocks are not adjacent (layers or V sit between them) but evenly
		// spaced: one strided run of 4 block copies per (kv, layer).
		{FormatCrossLayerNHD, 2 * 3},
		{FormatFlashInferNHD, 2 * 3},
	} {
		t.Run(tc.f.String(), func(t *testing.T) {
			d := dims{f: tc.f, nl: 3, nb: 16, bs: 8, nh: 2, hs: 16, item: 2}
			if tc.f == FormatMLA {
				d.nh = 1
			}
			c := newCache(r, d)
			l, err := Detect(Input{Tensors: c.tensors, Hints: Hints{KVLayout: hintFor(tc.f)}})
			if err != nil {
				t.Fatal(err)
			}
			p, err := l.Plan(32, []int64{5, 6, 7, 8}, []Chunk{{Index: 0, Obj: 0}}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Runs) != tc.want {
				t.Fatalf("%d runs, want %d", len(p.Runs), tc.want)
			}
		})
	}
}

func TestPlanRejectsBadRequests(t *testing.T) {
	d := dims{f: FormatNHD, nl: 2, nb: 4, bs: 4, nh: 1, hs: 4, item: 2}
	c := newCache(rand.New(rand.NewPCG(3, 3)), d)
	l, err := Detect(Input{Tensors: c.tensors})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		chunk  int64
		bids   []int64
		chunks []Chunk
		skip   int64
	}{
		{6, []int64{0, 1}, []Chunk{{0, 0}}, 0},              // chunk not a multiple of the block size
		{8, []int64{0}, []Chunk{{0, 0}}, 0},                 // too few block ids
		{8, []int64{0, 4}, []Chunk{{0, 0}}, 0},              // block id past NB
		{8, []int64{0, -1}, []Chunk{{0, 0}}, 0},             // negative block id
		{8, []int64{0, 1}, []Chunk{{0, 0}}, -1},             // negative skip
		{8, []int64{0, 1, 2, 3}, []Chunk{{-1, 0}}, 0},       // negative chunk index
		{16, []int64{0, 1, 2, 3}, []Chunk{{1 << 62, 0}}, 0}, // (index+1)·bpc wraps to 4
		{8, []int64{0, 1, 2, 3}, []Chunk{{1 << 62, 0}}, 0},  // (index+1)·bpc wraps negative
	} {
		if _, err := l.Plan(tc.chunk, tc.bids, tc.chunks, tc.skip); err == nil {
			t.Errorf("Plan(%d, %v, %v, %d) accepted", tc.chunk, tc.bids, tc.chunks, tc.skip)
		}
	}
	p, err := l.Plan(8, []int64{0, 1}, []Chunk{{0, 0}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	short := [][]byte{make([]byte, l.ObjectBytes(8)-1)}
	if err := p.Gather(c.segs, short); err == nil {
		t.Fatal("Gather into a short object accepted")
	}
	if short[0][0] != 0 {
		t.Fatal("a refused plan copied bytes")
	}
	if err := p.Scatter(c.segs[:1], [][]byte{make([]byte, l.ObjectBytes(8))}); err == nil {
		t.Fatal("Scatter with a missing segment accepted")
	}
}

func ExampleLayout_Plan() {
	shape := []int64{2, 4, 16, 8, 128} // NHD: 4 blocks of 16 tokens, 8 heads of 128
	st := []int64{4 * 16 * 8 * 128, 16 * 8 * 128, 8 * 128, 128, 1}
	var ts []Tensor
	for i := range 32 {
		ts = append(ts, Tensor{Dtype: "bfloat16", ItemSize: 2, Shape: shape, Stride: st, Segment: i})
	}
	l, _ := Detect(Input{Tensors: ts, Hints: Hints{KVLayout: "NHD"}})
	p, _ := l.Plan(32, []int64{2, 3}, []Chunk{{Index: 0, Obj: 0}}, 0)
	fmt.Println(l.Format, l.ObjectShape(32), len(p.Runs), p.Bytes)
	// Output: NHD [2 32 32 1024] 64 4194304
}
