package wire

import (
	"math"
	"testing"
)

// TestObjectBytesOverflow: a chunk object whose size does not fit an
// int64 is -1, not the wrapped product (0 or a small size that
// contradicts the shape), and the largest size that fits is exact.
func TestObjectBytesOverflow(t *testing.T) {
	for _, c := range []struct {
		layers, chunk, hidden int64
		mla                   bool
		item, want            int64
	}{
		{1 << 58, 16, 1, false, 2, -1},   // 2^64: wraps to 0
		{1<<58 + 1, 16, 1, false, 2, -1}, // wraps to 64
		{1 << 40, 1 << 20, 1 << 10, true, 1, -1},
		{math.MaxInt64, 1, 1, true, 2, -1},
		{1 << 56, 16, 1, false, 2, 1 << 62}, // fits
		{math.MaxInt64, 1, 1, true, 1, math.MaxInt64},
	} {
		if got := ChunkObjectBytes(c.layers, c.chunk, c.hidden, c.mla, c.item); got != c.want {
			t.Errorf("ChunkObjectBytes(%d, %d, %d, mla %v, %d) = %d, want %d", c.layers, c.chunk, c.hidden, c.mla, c.item, got, c.want)
		}
	}
}
