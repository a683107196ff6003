package quota

import (
	"errors"
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

// TestSetBounded: at the bound a new salt is refused with ErrTooMany and
// nothing changes, a held salt's limit can still be replaced, and a
// delete frees an entry. A table restored over the bound keeps every
// entry, refuses new salts until it is below the bound, and OverBound
// reports it once per episode.
func TestSetBounded(t *testing.T) {
	r := New()
	for _, s := range []string{"a", "b", "c"} {
		if err := r.SetBounded(s, 1, 3); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := r.SetBounded("d", 1, 3); !errors.Is(err, ErrTooMany) {
		t.Fatalf("4th salt at bound 3: %v, want ErrTooMany", err)
	}
	if _, ok := r.Get("d"); ok || r.Len() != 3 {
		t.Fatalf("refused salt set anyway: %v", r.Salts())
	}
	if ok, n := r.Admits("d", 3); ok || n != 3 {
		t.Fatalf("Admits(d) = %v, %d; want false, 3", ok, n)
	}
	if err := r.SetBounded("a", 2, 3); err != nil {
		t.Fatalf("replacing a held salt at the bound: %v", err)
	}
	if v, _ := r.Get("a"); v != 2 {
		t.Fatalf("a = %d after replace", v)
	}
	r.Delete("b")
	if err := r.SetBounded("d", 1, 3); err != nil {
		t.Fatalf("new salt after a delete: %v", err)
	}

	r.Restore(Limits{Explicit: map[string]int64{"1": 1, "2": 1, "3": 1, "4": 1, "5": 1}})
	if r.Len() != 5 {
		t.Fatalf("restore over the bound kept %d of 5", r.Len())
	}
	if n, first := r.OverBound(3); n != 5 || !first {
		t.Fatalf("OverBound = %d, %v; want 5, true", n, first)
	}
	if n, first := r.OverBound(3); n != 5 || first {
		t.Fatalf("second OverBound = %d, %v; want 5, false", n, first)
	}
	if err := r.SetBounded("new", 1, 3); !errors.Is(err, ErrTooMany) {
		t.Fatalf("new salt over the bound: %v", err)
	}
	if err := r.SetBounded("1", 9, 3); err != nil {
		t.Fatalf("replace over the bound: %v", err)
	}
	r.Delete("1")
	r.Delete("2")
	if err := r.SetBounded("new", 1, 3); !errors.Is(err, ErrTooMany) {
		t.Fatalf("new salt at exactly the bound: %v", err)
	}
	if _, first := r.OverBound(3); first {
		t.Fatal("OverBound within the bound reported")
	}
	r.Delete("3")
	if err := r.SetBounded("new", 1, 3); err != nil {
		t.Fatalf("new salt below the bound: %v", err)
	}
	r.Set("x", 1)
	r.Set("y", 1)
	if n, first := r.OverBound(3); n != 5 || !first {
		t.Fatalf("OverBound after going over again = %d, %v; want 5, true", n, first)
	}
}
