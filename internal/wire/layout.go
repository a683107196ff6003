package wire

import (
	"math"
	"math/bits"
)

// dtypeSizes are the element sizes of the torch dtype names vLLM sends in
// dtype_str and reads back from a slot's dtype, plus the short spellings
// operators use in --register-model.
var dtypeSizes = map[string]int64{
	"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4, "float64": 8, "double": 8,
	"uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
	"int16": 2, "int32": 4, "int64": 8,
	"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1,
}

// DtypeSize is the element size in bytes of a torch dtype name.
func DtypeSize(dtype string) (int64, bool) {
	n, ok := dtypeSizes[dtype]
	return n, ok
}

// ObjectShape is the shape of one chunk object in a shared-memory slot
// (research datapath.md 7.2): KV_2LTD [2, layers, chunk, hidden], or
// [layers, chunk, hidden] for MLA.
func ObjectShape(numLayers, chunkSize, hidden int64, mla bool) []int64 {
	if mla {
		return []int64{numLayers, chunkSize, hidden}
	}
	return []int64{2, numLayers, chunkSize, hidden}
}

// ObjectBytes is the size of an object of shape and element size item, or
// -1 when the product does not fit an int64. The dimensions come from
// clients (a REGISTER's num_layers and hidden_dim_size): a product that
// wrapped would be a small or zero size contradicting the shape, which
// every caller refuses as -1 instead (no pool holds such an object).
func ObjectBytes(shape []int64, item int64) int64 {
	n := item
	for _, d := range shape {
		hi, lo := bits.Mul64(uint64(abs(n)), uint64(abs(d)))
		if hi != 0 || lo > math.MaxInt64 {
			return -1
		}
		n *= d
	}
	return n
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// ChunkObjectBytes is the size in bytes of one rank's chunk object: the one
// formula the data path, --register-model and the bench share. hidden is
// the per-token width on that rank (for MLA the latent width), itemSize the
// element size of the dtype.
func ChunkObjectBytes(numLayers, chunkSize, hidden int64, mla bool, itemSize int64) int64 {
	return ObjectBytes(ObjectShape(numLayers, chunkSize, hidden, mla), itemSize)
}
