// Package overflow checks int64 arithmetic on sizes and offsets that come
// from a peer (tensor shapes, strides, block counts): a product or sum that
// wraps would read a small or negative length as valid and copy the wrong
// bytes or panic. The operands are non-negative by contract; a negative one
// reads as a uint64 of at least 2^63, so every nonzero product and every
// sum with one is refused rather than computed.
//
// It is the one way overflow is checked in the KV layout code (kvwrap,
// kvlayout): math/bits gives the carry and the high word, so no division
// or sign trick is needed.
package overflow

import (
	"math"
	"math/bits"
)

// Mul returns a·b and whether it is exact in an int64 (both operands
// non-negative).
func Mul(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return int64(lo), hi == 0 && lo <= math.MaxInt64
}

// Add returns a+b and whether it is exact in an int64 (both operands
// non-negative).
func Add(a, b int64) (int64, bool) {
	sum, carry := bits.Add64(uint64(a), uint64(b), 0)
	return int64(sum), carry == 0 && sum <= math.MaxInt64
}
