package overflow

import (
	"math"
	"testing"
)

// TestMulAdd: exact results pass with their value; a result past
// MaxInt64 and any negative operand (other than a zero product) are
// refused.
func TestMulAdd(t *testing.T) {
	muls := []struct {
		a, b, want int64
		ok         bool
	}{
		{0, 0, 0, true}, {0, math.MaxInt64, 0, true}, {3, 7, 21, true},
		{1 << 31, 1 << 31, 1 << 62, true}, {math.MaxInt64, 1, math.MaxInt64, true},
		{1 << 32, 1 << 31, 0, false}, {math.MaxInt64, 2, 0, false}, {1 << 50, 1 << 50, 0, false},
		{-1, 1, 0, false}, {2, -3, 0, false}, {-1, -1, 0, false}, {-1, 0, 0, true},
	}
	for _, c := range muls {
		got, ok := Mul(c.a, c.b)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("Mul(%d, %d) = %d, %v; want %d, %v", c.a, c.b, got, ok, c.want, c.ok)
		}
	}
	adds := []struct {
		a, b, want int64
		ok         bool
	}{
		{0, 0, 0, true}, {3, 4, 7, true}, {math.MaxInt64 - 1, 1, math.MaxInt64, true},
		{math.MaxInt64, 1, 0, false}, {1 << 62, 1 << 62, 0, false},
		{-1, 1, 0, false}, {5, -2, 0, false}, {-1, 0, 0, false},
	}
	for _, c := range adds {
		got, ok := Add(c.a, c.b)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("Add(%d, %d) = %d, %v; want %d, %v", c.a, c.b, got, ok, c.want, c.ok)
		}
	}
}
