package kvlayout

import (
	"errors"
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/wire"
)

func rowMajor(shape ...int64) Tensor {
	st := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= shape[i]
	}
	return Tensor{Dtype: "bfloat16", ItemSize: 2, Shape: shape, Stride: st}
}

func layers(n int, t Tensor) []Tensor {
	out := make([]Tensor, n)
	for i := range out {
		out[i] = t
		out[i].Segment = i
	}
	return out
}

// TestDetect: each vLLM format is recognised from rank, shape, hints and
// device, with (blocks, block size, heads, head size) read off the right
// axes.
func TestDetect(t *testing.T) {
	cases := []struct {
		name                   string
		in                     Input
		want                   Format
		layers, nb, bs, nh, hs int64
	}{
		{"NHD hint", Input{Tensors: layers(4, rowMajor(2, 100, 16, 8, 128)), Hints: Hints{KVLayout: "NHD"}}, FormatNHD, 4, 100, 16, 8, 128},
		{"NHD default on CUDA", Input{Tensors: layers(4, rowMajor(2, 100, 16, 8, 128))}, FormatNHD, 4, 100, 16, 8, 128},
		{"HND hint", Input{Tensors: layers(2, rowMajor(2, 100, 8, 16, 128)), Hints: Hints{KVLayout: "HND"}}, FormatHND, 2, 100, 16, 8, 128},
		{"vLLM name LBHNC", Input{Tensors: layers(2, rowMajor(2, 100, 8, 16, 128)), Hints: Hints{KVLayout: "LBHNC"}}, FormatHND, 2, 100, 16, 8, 128},
		// vLLM's CPU backend allocates HND whatever it says.
		{"CPU ignores an NHD hint", Input{Tensors: layers(2, rowMajor(2, 100, 8, 16, 128)), CPU: true, Hints: Hints{KVLayout: "NHD"}}, FormatHND, 2, 100, 16, 8, 128},
		// ... unless the token/head counts say otherwise.
		{"CPU NHD by tokens_per_block", Input{Tensors: layers(2, rowMajor(2, 100, 16, 8, 128)), CPU: true, Hints: Hints{TokensPerBlock: 16}}, FormatNHD, 2, 100, 16, 8, 128},
		{"HND by num_kv_heads", Input{Tensors: layers(2, rowMajor(2, 100, 8, 16, 128)), Hints: Hints{KVLayout: "NHD", NumKVHeads: 8}}, FormatHND, 2, 100, 16, 8, 128},
		{"FlashInfer NHD", Input{Tensors: layers(3, rowMajor(50, 2, 16, 4, 64))}, FormatFlashInferNHD, 3, 50, 16, 4, 64},
		{"FlashInfer HND", Input{Tensors: layers(3, rowMajor(50, 2, 4, 16, 64)), Hints: Hints{KVLayout: "HND"}}, FormatFlashInferHND, 3, 50, 16, 4, 64},
		// A lone head: [NB,2,16,1,HS] is read token-first whatever the hint.
		{"FlashInfer lone head", Input{Tensors: layers(1, rowMajor(50, 2, 16, 1, 64)), Hints: Hints{KVLayout: "HND"}}, FormatFlashInferNHD, 1, 50, 16, 1, 64},
		// Upstream's quirk, kept: two FlashInfer blocks read as K/V-first.
		{"FlashInfer with 2 blocks", Input{Tensors: layers(1, rowMajor(2, 2, 16, 4, 64))}, FormatNHD, 1, 2, 16, 4, 64},
		{"fused NHD", Input{Tensors: layers(2, rowMajor(30, 16, 4, 256))}, FormatFusedNHD, 2, 30, 16, 4, 128},
		{"fused HND", Input{Tensors: layers(2, rowMajor(30, 4, 16, 256)), Hints: Hints{KVLayout: "HND"}}, FormatFusedHND, 2, 30, 16, 4, 128},
		{"MLA", Input{Tensors: layers(61, rowMajor(200, 64, 576))}, FormatMLA, 61, 200, 64, 1, 576},
		{"cross-layer NHD", Input{Tensors: []Tensor{rowMajor(100, 28, 2, 16, 8, 128)}}, FormatCrossLayerNHD, 28, 100, 16, 8, 128},
		{"cross-layer HND", Input{Tensors: []Tensor{rowMajor(100, 28, 2, 8, 16, 128)}, Hints: Hints{KVLayout: "HND"}}, FormatCrossLayerHND, 28, 100, 16, 8, 128},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Detect(c.in)
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			got := []int64{l.NumLayers, l.NumBlocks, l.BlockSize, l.NumHeads, l.HeadSize}
			if l.Format != c.want || !slices.Equal(got, []int64{c.layers, c.nb, c.bs, c.nh, c.hs}) {
				t.Fatalf("got %v %v, want %v %v", l.Format, got, c.want, []int64{c.layers, c.nb, c.bs, c.nh, c.hs})
			}
		})
	}
}

func TestDetectRefuses(t *testing.T) {
	a := rowMajor(2, 10, 16, 8, 64)
	b := rowMajor(2, 10, 16, 4, 64)
	fp8 := a
	fp8.Dtype, fp8.ItemSize = "float8_e4m3fn", 1
	cases := []struct {
		name string
		in   Input
		want error
	}{
		{"several groups", Input{Tensors: layers(2, a), Groups: 2}, ErrHybrid},
		{"layers of different shapes", Input{Tensors: []Tensor{a, b}}, ErrHybrid},
		{"layers of different dtypes", Input{Tensors: []Tensor{a, fp8}}, ErrHybrid},
		{"no tensors", Input{}, ErrUnsupported},
		{"rank 2", Input{Tensors: layers(2, rowMajor(10, 16))}, ErrUnsupported},
		{"rank 5 without a 2 axis", Input{Tensors: layers(2, rowMajor(3, 10, 16, 8, 64))}, ErrUnsupported},
		{"odd fused dim", Input{Tensors: layers(2, rowMajor(10, 16, 8, 63))}, ErrUnsupported},
		{"unknown hint", Input{Tensors: layers(2, a), Hints: Hints{KVLayout: "BHND"}}, ErrUnsupported},
		{"hints fit no reading", Input{Tensors: layers(2, a), Hints: Hints{TokensPerBlock: 32}}, ErrUnsupported},
		{"SGLang", Input{Tensors: layers(2, a), Engine: "SGLANG"}, ErrUnsupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Detect(c.in); !errors.Is(err, c.want) {
				t.Fatalf("Detect error = %v, want %v", err, c.want)
			}
		})
	}
}

// TestObjectLayoutMatchesEngineDriven: the object an lmcache-driven store
// writes has the shape and size the engine-driven path (internal/wire)
// gives the same model, so either path reads the other's objects. fp8
// and other byte dtypes are plain 1-byte elements.
func TestObjectLayoutMatchesEngineDriven(t *testing.T) {
	for _, tc := range []struct {
		t     Tensor
		n     int
		dtype string
		mla   bool
	}{
		{rowMajor(2, 10, 16, 8, 128), 32, "bfloat16", false},
		{rowMajor(10, 16, 576), 61, "float8_e4m3fn", true},
		{rowMajor(2, 10, 16, 2, 64), 4, "uint8", false},
	} {
		item, _ := wire.DtypeSize(tc.dtype)
		tc.t.Dtype, tc.t.ItemSize = tc.dtype, item
		l, err := Detect(Input{Tensors: layers(tc.n, tc.t)})
		if err != nil {
			t.Fatal(err)
		}
		want := wire.ObjectShape(int64(tc.n), 256, l.Hidden(), tc.mla)
		if !slices.Equal(l.ObjectShape(256), want) || l.ObjectBytes(256) != wire.ObjectBytes(want, item) {
			t.Fatalf("%s: object %v / %d bytes, engine-driven %v / %d", tc.dtype, l.ObjectShape(256), l.ObjectBytes(256), want, wire.ObjectBytes(want, item))
		}
	}
}
