package kvlayout

import (
	"errors"
	"strings"
	"testing"
)

// TestDetectRefusesOverlappingViews: a view in which two elements share
// an address (a zero stride, as expand() makes, or rows that overlap) is
// not a paged KV cache: a retrieve would write one address from several
// rows. Such a view also costs the client almost no memory however large
// its shape, and its rows never coalesce, so accepting it let a
// 128-byte segment make Detect, and then every Plan, build one copy per
// row (a million per block below).
func TestDetectRefusesOverlappingViews(t *testing.T) {
	cases := []struct {
		name   string
		shape  []int64
		stride []int64
		hints  Hints
	}{
		// HND [2, NB, NH, BS, HS] whose 1024 heads × 1024 tokens all
		// alias row 0 of their block.
		{"zero head and token strides", []int64{2, 4, 1024, 1024, 8}, []int64{32, 8, 0, 0, 1}, Hints{KVLayout: "HND"}},
		// NHD [2, NB, BS, NH, HS] with token stride = head stride: token 1 is head 1.
		{"tokens alias heads", []int64{2, 4, 16, 8, 128}, []int64{16384, 4096, 128, 128, 1}, Hints{KVLayout: "NHD"}},
		// Head rows of 128 elements placed 64 apart: each overlaps the next.
		{"overlapping rows", []int64{2, 4, 16, 8, 128}, []int64{32768, 8192, 512, 64, 1}, Hints{KVLayout: "NHD"}},
		// A negative stride reaches before the view's base.
		{"negative stride", []int64{2, 4, 16, 8, 128}, []int64{65536, 16384, -1024, 128, 1}, Hints{KVLayout: "NHD"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts := layers(2, Tensor{Dtype: "bfloat16", ItemSize: 2, Shape: c.shape, Stride: c.stride})
			l, err := Detect(Input{Tensors: ts, Hints: c.hints})
			if !errors.Is(err, ErrUnsupported) {
				t.Fatalf("Detect(%v, %v) accepted (%d copies per block template, error %v); want ErrUnsupported",
					c.shape, c.stride, len(l.blockTemplate), err)
			}
		})
	}
	// Padding between blocks and a permuted allocation keep every element
	// distinct and are still accepted.
	padded := Tensor{Dtype: "bfloat16", ItemSize: 2, Shape: []int64{2, 4, 16, 8, 128}, Stride: []int64{4 * 20000, 20000, 1024, 128, 1}}
	if l, err := Detect(Input{Tensors: layers(2, padded), Hints: Hints{KVLayout: "NHD"}}); err != nil || l.Format != FormatNHD {
		t.Fatalf("padded NHD: %v, %v", l, err)
	}
	// HND memory [2, NB, NH, BS, HS] viewed as NHD [2, NB, BS, NH, HS].
	permuted := Tensor{Dtype: "bfloat16", ItemSize: 2, Shape: []int64{2, 4, 16, 8, 128}, Stride: []int64{65536, 16384, 128, 2048, 1}}
	if l, err := Detect(Input{Tensors: layers(2, permuted), Hints: Hints{KVLayout: "NHD"}}); err != nil || l.Format != FormatNHD {
		t.Fatalf("permuted NHD: %v, %v", l, err)
	}
	// Axes of size 1 may carry any stride (torch leaves them arbitrary).
	lone := Tensor{Dtype: "bfloat16", ItemSize: 2, Shape: []int64{2, 4, 16, 1, 128}, Stride: []int64{8192, 2048, 128, 0, 1}}
	if l, err := Detect(Input{Tensors: layers(2, lone), Hints: Hints{KVLayout: "NHD"}}); err != nil || l.NumHeads != 1 {
		t.Fatalf("lone head with stride 0: %v, %v", l, err)
	}
}

// TestDetectBoundsBlockTemplate: a block of more than maxBlockCopies
// rows is refused before its copy template is walked. The client's
// declared sizes are all Detect sees of a CUDA storage, so without the
// bound a shape of 2^20 × 2^20 rows kept REGISTER_KV_CACHE walking for
// hours.
func TestDetectBoundsBlockTemplate(t *testing.T) {
	// HND [2, 1, NH=4096, BS=2048, HS=1]: 2^23 rows per block, packed.
	big := rowMajor(2, 1, 4096, 2048, 1)
	_, err := Detect(Input{Tensors: []Tensor{big}, Hints: Hints{KVLayout: "HND"}})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "8388608 copies per block (limit 4194304)") {
		t.Fatalf("Detect of 2^23 rows per block: %v, want ErrUnsupported naming the limit", err)
	}
	// 2^22 rows is the most accepted.
	edge := rowMajor(2, 1, 2048, 2048, 1)
	if l, err := Detect(Input{Tensors: []Tensor{edge}, Hints: Hints{KVLayout: "HND"}}); err != nil || l.BlockSize*l.NumHeads != maxBlockCopies {
		t.Fatalf("Detect of 2^22 rows per block: %v, %v", l, err)
	}
}

// TestDetectRefusesByteOverflow: a view whose byte span does not fit an
// int64 is refused; before, its head size times the item size wrapped
// to a negative copy length.
func TestDetectRefusesByteOverflow(t *testing.T) {
	// NHD [2, 1, 1, 1, 2^62] bfloat16: 2^63 elements of 2 bytes.
	tt := Tensor{Dtype: "bfloat16", ItemSize: 2, Shape: []int64{2, 1, 1, 1, 1 << 62}, Stride: []int64{1 << 62, 1, 1, 1, 1}}
	l, err := Detect(Input{Tensors: []Tensor{tt}, Hints: Hints{KVLayout: "NHD"}})
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Detect accepted head size %d (copy length %d, error %v); want ErrUnsupported",
			l.HeadSize, l.blockTemplate[0].Len, err)
	}
}

// TestCheckRefusesWrappingRuns: Check is the fence that makes a plan run
// whole or not at all (kvcopy's streaming kernel copies through raw
// addresses after it). A run whose last row lies past 2^63 bytes, or that
// names a negative segment or object, is refused, not wrapped to a small
// end or indexed.
func TestCheckRefusesWrappingRuns(t *testing.T) {
	segs := [][]byte{make([]byte, 64)}
	objs := [][]byte{make([]byte, 64)}
	cases := map[string]Run{
		// (Count-1)·SegStep = 2^14·2^50 = 2^64, which wraps to 0: the run
		// seemed to end at byte 32 of the segment.
		"segment step wraps": {Len: 32, Count: 1<<14 + 1, SegStep: 1 << 50},
		"object step wraps":  {Len: 32, Count: 1<<14 + 1, ObjStep: 1 << 50},
		"negative segment":   {Seg: -1, Len: 1, Count: 1},
		"negative object":    {Obj: -1, Len: 1, Count: 1},
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			p := &Plan{Runs: []Run{r}, Bytes: r.Len * r.Count}
			if err := p.Check(segs, objs); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("Check(%+v) = %v, want ErrBadRequest", r, err)
			}
			if err := p.Gather(segs, objs); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("Gather(%+v) = %v, want ErrBadRequest", r, err)
			}
		})
	}
	// The largest run that fits exactly is still accepted.
	ok := &Plan{Runs: []Run{{Len: 16, Count: 4, SegStep: 16, ObjStep: 16}}, Bytes: 64}
	if err := ok.Check(segs, objs); err != nil {
		t.Fatalf("Check of a run ending at byte 64 of 64: %v", err)
	}
	over := &Plan{Runs: []Run{{Len: 16, Count: 4, SegStep: 16, ObjStep: 16, SegOff: 1}}, Bytes: 64}
	if err := over.Check(segs, objs); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("Check of a run ending at byte 65 of 64: %v", err)
	}
}
