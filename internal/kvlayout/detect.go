// Package kvlayout recognises an inference engine's paged KV-cache format
// from the tensors it registers (ranks, shapes, strides, layout hints,
// engine type) and plans the byte copies between its paged blocks and the
// L1 chunk objects the engine-driven data path already stores: KV_2LTD
// [2, layers, chunk, heads·head_size] for attention with separate K and V,
// [layers, chunk, latent] for MLA (internal/wire.ObjectShape), hidden in
// (head, dim) order. An object stored through either path therefore reads
// back byte-exact through the other.
//
// The formats are the vLLM ones LMCache's detector knows (read at
// lmcache/v1/gpu_connector/kv_format/detectors/vllm.py@08172b42 and the
// spec names under kv_format/specs): per-layer NHD [2,NB,BS,NH,HS] and
// HND [2,NB,NH,BS,HS], FlashInfer's block-major [NB,2,BS,NH,HS] /
// [NB,2,NH,BS,HS], blocks-first fused K/V [NB,BS,NH,2·HS] /
// [NB,NH,BS,2·HS], MLA's rank-3 latent cache [NB,BS,latent], and the
// cross-layer single tensor [NB,NL,2,BS,NH,HS] / [NB,NL,2,NH,BS,HS] of
// newer vLLM. Byte dtypes (fp8, uint8) are ordinary element sizes here.
// Hybrid models (several KV groups, layers of different shapes) are
// refused with ErrHybrid.
package kvlayout

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lmcache-go/lmcache/internal/overflow"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// Errors returned by Detect and Plan.
var (
	// ErrUnsupported: the tensors match no known paged format.
	ErrUnsupported = errors.New("unsupported kv cache format")
	// ErrHybrid: several KV cache groups (hybrid attention) are not
	// supported on the lmcache-driven path.
	ErrHybrid = errors.New("hybrid kv cache groups are not supported")
	// ErrBadRequest: block ids, chunk size or token range do not fit the
	// registered layout.
	ErrBadRequest = errors.New("copy request does not fit the kv layout")
)

// Format is a paged KV-cache memory format.
type Format int

// The formats; names follow the axis order of one layer's tensor
// (NB blocks, BS tokens per block, NH heads, HS head size).
const (
	FormatNHD           Format = iota + 1 // per layer [2, NB, BS, NH, HS]
	FormatHND                             // per layer [2, NB, NH, BS, HS]
	FormatFlashInferNHD                   // per layer [NB, 2, BS, NH, HS]
	FormatFlashInferHND                   // per layer [NB, 2, NH, BS, HS]
	FormatFusedNHD                        // per layer [NB, BS, NH, 2·HS]
	FormatFusedHND                        // per layer [NB, NH, BS, 2·HS]
	FormatMLA                             // per layer [NB, BS, latent]
	FormatCrossLayerNHD                   // one tensor [NB, NL, 2, BS, NH, HS]
	FormatCrossLayerHND                   // one tensor [NB, NL, 2, NH, BS, HS]
)

var formatNames = map[Format]string{
	FormatNHD: "NHD", FormatHND: "HND", FormatFlashInferNHD: "flashinfer_NHD",
	FormatFlashInferHND: "flashinfer_HND", FormatFusedNHD: "fused_NHD", FormatFusedHND: "fused_HND",
	FormatMLA: "MLA", FormatCrossLayerNHD: "cross_layer_NHD", FormatCrossLayerHND: "cross_layer_HND",
}

// String is the format's short name (as /status and logs show it).
func (f Format) String() string {
	if n, ok := formatNames[f]; ok {
		return n
	}
	return fmt.Sprintf("format(%d)", int(f))
}

// Tensor is one registered KV tensor as the wrapper described it: a
// strided view (in elements) into a memory segment.
type Tensor struct {
	Dtype    string
	ItemSize int64
	Shape    []int64
	Stride   []int64
	// Segment identifies the memory the view lives in (the executor's
	// index); several layers may share one segment.
	Segment int
	// BaseByte is the byte offset of the view's element 0 in the segment
	// (storage_offset × item size).
	BaseByte int64
}

// Hints are the layout hints a client sends (LayoutHints): all optional.
type Hints struct {
	// KVLayout is "NHD", "HND" or vLLM's "LBNHC"/"LBHNC"; "" if absent.
	KVLayout string
	// TokensPerBlock and NumKVHeads are 0 when unknown. When present
	// they settle NHD against HND from the shape itself.
	TokensPerBlock, NumKVHeads int64
}

// Input is what Detect looks at.
type Input struct {
	Tensors []Tensor
	// Engine is the engine type as sent ("" or a vLLM value; SGLang and
	// TensorRT-LLM names are refused).
	Engine string
	// CPU says the tensors are CPU memory (shared-memory wrappers).
	// vLLM's CPU attention backend allocates HND and says NHD, so on CPU
	// an unhinted or NHD-hinted vLLM cache is read as HND, as upstream's
	// detector does, unless TokensPerBlock/NumKVHeads say otherwise.
	CPU    bool
	Hints  Hints
	Groups int // number of engine KV groups (len(engine_group_infos))
}

// Layout is a detected paged KV layout. Its element address is
// base(layer) + kv·sKV + block·sB + token·sT + head·sH + dim·sD.
type Layout struct {
	Format    Format
	Dtype     string
	ItemSize  int64
	NumLayers int64
	NumBlocks int64
	BlockSize int64
	// NumHeads is the KV heads of this rank (1 for MLA).
	NumHeads int64
	// HeadSize is the head dimension (the latent width for MLA).
	HeadSize int64

	layers              []layerAddr
	sKV, sB, sT, sH, sD int64 // element strides
	blockTemplate       []Run // one full block, relative offsets
}

type layerAddr struct {
	seg  int
	base int64 // bytes
}

// MLA reports whether the layout has a single latent (no K/V split).
func (l *Layout) MLA() bool { return l.Format == FormatMLA }

// Hidden is the per-token width of one object row: NH·HS, or the
// latent width for MLA.
func (l *Layout) Hidden() int64 { return l.NumHeads * l.HeadSize }

// ObjectShape is the L1 object shape for chunkSize tokens: wire.ObjectShape
// of this layout, so that both data paths store the same objects.
func (l *Layout) ObjectShape(chunkSize int64) []int64 {
	return wire.ObjectShape(l.NumLayers, chunkSize, l.Hidden(), l.MLA())
}

// ObjectBytes is the size of one chunk object of chunkSize tokens
// (wire.ChunkObjectBytes, the one formula every path shares).
func (l *Layout) ObjectBytes(chunkSize int64) int64 {
	return wire.ChunkObjectBytes(l.NumLayers, chunkSize, l.Hidden(), l.MLA(), l.ItemSize)
}

// Detect recognises the format of in.Tensors.
func Detect(in Input) (*Layout, error) {
	if in.Groups > 1 {
		return nil, fmt.Errorf("%w: %d groups registered", ErrHybrid, in.Groups)
	}
	if len(in.Tensors) == 0 {
		return nil, fmt.Errorf("%w: no kv tensors", ErrUnsupported)
	}
	// EngineType's wire value was not pinned (an enum value); only the
	// engines whose layouts are known to differ are refused by name.
	if e := strings.ToLower(in.Engine); strings.Contains(e, "sglang") || strings.Contains(e, "trt") {
		return nil, fmt.Errorf("%w: engine type %q (only vLLM layouts are known)", ErrUnsupported, in.Engine)
	}
	t0 := in.Tensors[0]
	for i, t := range in.Tensors[1:] {
		if !slices.Equal(t.Shape, t0.Shape) || !slices.Equal(t.Stride, t0.Stride) || t.Dtype != t0.Dtype || t.ItemSize != t0.ItemSize {
			return nil, fmt.Errorf("%w: layer %d is %s%v, layer 0 is %s%v (layers of different shapes mean several groups)",
				ErrHybrid, i+1, t.Dtype, t.Shape, t0.Dtype, t0.Shape)
		}
	}
	if t0.ItemSize <= 0 || len(t0.Shape) != len(t0.Stride) {
		return nil, fmt.Errorf("%w: item size %d, shape %v, stride %v", ErrUnsupported, t0.ItemSize, t0.Shape, t0.Stride)
	}
	if err := checkView(t0); err != nil {
		return nil, err
	}
	s, st := t0.Shape, t0.Stride
	l := &Layout{Dtype: t0.Dtype, ItemSize: t0.ItemSize, NumLayers: int64(len(in.Tensors))}
	hnd, err := resolveHND(in, s)
	if err != nil {
		return nil, err
	}
	switch {
	case len(in.Tensors) == 1 && len(s) == 6 && s[2] == 2:
		l.NumLayers = s[1]
		if hnd {
			l.Format = FormatCrossLayerHND
			l.set(s[0], s[4], s[3], s[5], st[2], st[0], st[4], st[3], st[5])
		} else {
			l.Format = FormatCrossLayerNHD
			l.set(s[0], s[3], s[4], s[5], st[2], st[0], st[3], st[4], st[5])
		}
		for i := range l.NumLayers {
			l.layers = append(l.layers, layerAddr{seg: t0.Segment, base: t0.BaseByte + i*st[1]*t0.ItemSize})
		}
	case len(s) == 5 && s[0] == 2:
		// K/V axis first. Upstream tests this before shape[1] == 2, so a
		// FlashInfer cache with exactly two blocks is read this way; the
		// quirk is kept so both servers agree on such a cache.
		if hnd {
			l.Format = FormatHND
			l.set(s[1], s[3], s[2], s[4], st[0], st[1], st[3], st[2], st[4])
		} else {
			l.Format = FormatNHD
			l.set(s[1], s[2], s[3], s[4], st[0], st[1], st[2], st[3], st[4])
		}
	case len(s) == 5 && s[1] == 2:
		// A lone head makes both readings byte-identical; vLLM emits the
		// token-first view, so read [NB,2,BS,1,HS] as NHD whatever the hint.
		if hnd && (s[3] != 1 || s[2] == 1) {
			l.Format = FormatFlashInferHND
			l.set(s[0], s[3], s[2], s[4], st[1], st[0], st[3], st[2], st[4])
		} else {
			l.Format = FormatFlashInferNHD
			l.set(s[0], s[2], s[3], s[4], st[1], st[0], st[2], st[3], st[4])
		}
	case len(s) == 4:
		if s[3]%2 != 0 {
			return nil, fmt.Errorf("%w: fused K/V trailing dim %d is not 2·head_size", ErrUnsupported, s[3])
		}
		hs := s[3] / 2
		if hnd {
			l.Format = FormatFusedHND
			l.set(s[0], s[2], s[1], hs, hs*st[3], st[0], st[2], st[1], st[3])
		} else {
			l.Format = FormatFusedNHD
			l.set(s[0], s[1], s[2], hs, hs*st[3], st[0], st[1], st[2], st[3])
		}
	case len(s) == 3:
		l.Format = FormatMLA
		l.set(s[0], s[1], 1, s[2], 0, st[0], st[1], 0, st[2])
	default:
		return nil, fmt.Errorf("%w: %d tensor(s) of shape %v", ErrUnsupported, len(in.Tensors), s)
	}
	if l.layers == nil {
		for _, t := range in.Tensors {
			l.layers = append(l.layers, layerAddr{seg: t.Segment, base: t.BaseByte})
		}
	}
	if l.NumBlocks <= 0 || l.BlockSize <= 0 || l.NumHeads <= 0 || l.HeadSize <= 0 {
		return nil, fmt.Errorf("%w: empty axis in shape %v", ErrUnsupported, s)
	}
	// checkView made every product of axes fit an int64, so this cannot
	// wrap; the walk below makes one copy per row (per element when the
	// head dim is strided) before coalescing them.
	copies := l.BlockSize * l.NumHeads
	if l.sD != 1 {
		copies *= l.HeadSize
	}
	if copies > maxBlockCopies {
		return nil, fmt.Errorf("%w: shape %v needs %d copies per block (limit %d)", ErrUnsupported, s, copies, maxBlockCopies)
	}
	l.blockTemplate = l.template(0, l.BlockSize)
	return l, nil
}

// maxBlockCopies bounds the single copies one block's template is built
// from (tokens × heads, times the head size when the head dim is not
// unit-stride). vLLM's blocks have at most a few tens of thousands of
// rows; the bound is there because for CUDA wrappers the sizes Detect
// sees are only what the client declared, and a shape of 2^20 × 2^20
// rows would keep REGISTER_KV_CACHE walking for hours.
const maxBlockCopies = 1 << 22

// checkView refuses a view that cannot be a paged KV cache: a negative
// stride, two elements at one address (a zero stride on an axis longer
// than 1, as expand() makes, or rows that overlap), or a byte span past
// int64. Overlap is tested with the usual sufficient condition: with the
// axes sorted by stride, each stride exceeds the furthest offset the
// smaller ones reach. Every engine layout (a permutation of a dense
// allocation, padding allowed) passes it. A view that passes has at most
// span+1 elements, so products of its axes cannot overflow later.
func checkView(t Tensor) error {
	type axis struct{ size, stride int64 }
	var axes []axis
	for i, d := range t.Shape {
		if d <= 0 || t.Stride[i] < 0 {
			return fmt.Errorf("%w: shape %v stride %v", ErrUnsupported, t.Shape, t.Stride)
		}
		if d > 1 { // a length-1 axis is never stepped; its stride is arbitrary
			axes = append(axes, axis{d, t.Stride[i]})
		}
	}
	slices.SortFunc(axes, func(a, b axis) int { return cmp.Compare(a.stride, b.stride) })
	span := int64(0) // furthest element offset reached so far
	for _, a := range axes {
		if a.stride <= span {
			return fmt.Errorf("%w: shape %v stride %v maps several elements to one address", ErrUnsupported, t.Shape, t.Stride)
		}
		step, ok := overflow.Mul(a.size-1, a.stride)
		if ok {
			span, ok = overflow.Add(span, step)
		}
		if !ok {
			return fmt.Errorf("%w: shape %v stride %v spans more than 2^63 elements", ErrUnsupported, t.Shape, t.Stride)
		}
	}
	// span+1 wraps only for span = MaxInt64, to a negative operand that
	// overflow.Mul refuses.
	if _, ok := overflow.Mul(span+1, t.ItemSize); !ok {
		return fmt.Errorf("%w: shape %v stride %v of %d-byte items spans more than 2^63 bytes", ErrUnsupported, t.Shape, t.Stride, t.ItemSize)
	}
	return nil
}

func (l *Layout) set(nb, bs, nh, hs, sKV, sB, sT, sH, sD int64) {
	l.NumBlocks, l.BlockSize, l.NumHeads, l.HeadSize = nb, bs, nh, hs
	l.sKV, l.sB, l.sT, l.sH, l.sD = sKV, sB, sT, sH, sD
}

// resolveHND decides heads-before-tokens for the 4-, 5- and 6-D formats.
func resolveHND(in Input, s []int64) (bool, error) {
	var tokNHD, headNHD int64 // the (tokens, heads) reading under NHD
	switch {
	case len(s) == 6:
		tokNHD, headNHD = s[3], s[4]
	case len(s) == 5 && s[0] == 2:
		tokNHD, headNHD = s[2], s[3]
	case len(s) == 5 && s[1] == 2:
		tokNHD, headNHD = s[2], s[3]
	case len(s) == 4:
		tokNHD, headNHD = s[1], s[2]
	default:
		return false, nil
	}
	h := in.Hints
	if h.TokensPerBlock > 0 || h.NumKVHeads > 0 {
		nhdOK := (h.TokensPerBlock == 0 || h.TokensPerBlock == tokNHD) && (h.NumKVHeads == 0 || h.NumKVHeads == headNHD)
		hndOK := (h.TokensPerBlock == 0 || h.TokensPerBlock == headNHD) && (h.NumKVHeads == 0 || h.NumKVHeads == tokNHD)
		switch {
		case nhdOK && !hndOK:
			return false, nil
		case hndOK && !nhdOK:
			return true, nil
		case !nhdOK && !hndOK:
			return false, fmt.Errorf("%w: shape %v fits neither tokens_per_block=%d nor num_kv_heads=%d",
				ErrUnsupported, s, h.TokensPerBlock, h.NumKVHeads)
		}
	}
	if in.CPU {
		return true, nil
	}
	switch strings.ToUpper(h.KVLayout) {
	case "", "NHD", "LBNHC":
		return false, nil
	case "HND", "LBHNC":
		return true, nil
	}
	return false, fmt.Errorf("%w: kv_layout hint %q", ErrUnsupported, h.KVLayout)
}

// Extent is a byte range of one memory segment.
type Extent struct {
	Seg      int
	Off, Len int64
}

// BlockExtents is where block id of layer li lives: one byte range per
// K and V (one for MLA), in that order, each the block's rows exactly as
// stored. POST /cache/checksums hashes these bytes. Fused K/V and
// cross-layer formats are refused with ErrUnsupported, as upstream's
// endpoint declines them, and so is a block whose rows are not packed.
func (l *Layout) BlockExtents(li int, id int64) ([]Extent, error) {
	switch l.Format {
	case FormatFusedNHD, FormatFusedHND, FormatCrossLayerNHD, FormatCrossLayerHND:
		return nil, fmt.Errorf("%w: %s blocks are not addressable one layer at a time", ErrUnsupported, l.Format)
	}
	if li < 0 || li >= len(l.layers) {
		return nil, fmt.Errorf("%w: layer %d of %d", ErrBadRequest, li, len(l.layers))
	}
	if id < 0 || id >= l.NumBlocks {
		return nil, fmt.Errorf("%w: block id %d outside [0, %d)", ErrBadRequest, id, l.NumBlocks)
	}
	elems := l.BlockSize * l.NumHeads * l.HeadSize
	span := (l.BlockSize-1)*l.sT + (l.NumHeads-1)*l.sH + (l.HeadSize-1)*l.sD + 1
	if span != elems || min(l.sT, l.sH, l.sD) < 0 {
		return nil, fmt.Errorf("%w: %s block rows are not packed (strides %d/%d/%d)", ErrUnsupported, l.Format, l.sT, l.sH, l.sD)
	}
	nkv := int64(2)
	if l.MLA() {
		nkv = 1
	}
	la := l.layers[li]
	out := make([]Extent, 0, nkv)
	for kv := range nkv {
		out = append(out, Extent{Seg: la.seg, Off: la.base + (kv*l.sKV+id*l.sB)*l.ItemSize, Len: elems * l.ItemSize})
	}
	return out, nil
}
