package quota

import (
	"math"
	"testing"
)

func TestBytesFromGBTruncatesLikePython(t *testing.T) {
	for gb, want := range map[float64]int64{0: 0, 0.1: 107374182, 2.5: 2684354560, 1.0 / 1024: 1 << 20} {
		if got, err := BytesFromGB(gb); err != nil || got != want {
			t.Errorf("%v GiB = %d, %v; want %d", gb, got, err, want)
		}
	}
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1), 1e30} {
		if _, err := BytesFromGB(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestEffectiveLimit(t *testing.T) {
	r := New()
	if _, ok := r.Snapshot().Effective("a"); ok {
		t.Fatal("null default must exempt")
	}
	r.Set("a", 0)
	if v, ok := r.Snapshot().Effective("a"); !ok || v != 0 {
		t.Fatal("explicit 0 must apply under a null default")
	}
	d := int64(5)
	r.SetDefault(&d)
	if v, ok := r.Snapshot().Effective("b"); !ok || v != 5 {
		t.Fatal("default applies to unquota'd salts")
	}
	if v, _ := r.Snapshot().Effective("a"); v != 0 {
		t.Fatal("explicit entry wins over the default")
	}
	if !r.Delete("a") || r.Delete("a") || len(r.Salts()) != 0 {
		t.Fatalf("Delete reports removal once; salts left %v", r.Salts())
	}
}
