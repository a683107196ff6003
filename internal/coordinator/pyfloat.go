package coordinator

import (
	"math"
	"strconv"
	"strings"
)

// pyFloat marshals like Python's float repr (2.0 rather than Go's 2), so
// byte-level clients see what upstream writes.
type pyFloat float64

func (f pyFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	if v == 0 {
		return []byte("0.0"), nil
	}
	exp := int(math.Floor(math.Log10(math.Abs(v))))
	// Recompute the exponent from the shortest repr to avoid Log10 rounding.
	e := strconv.FormatFloat(v, 'e', -1, 64)
	if i := strings.IndexByte(e, 'e'); i >= 0 {
		if n, err := strconv.Atoi(e[i+1:]); err == nil {
			exp = n
		}
	}
	if exp < -4 || exp >= 16 {
		return []byte(e), nil
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return []byte(s), nil
}
