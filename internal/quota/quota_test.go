package quota

import (
	"errors"
	"strconv"
	"testing"
)

func TestManager(t *testing.T) {
	m := New()
	if err := m.Set("a", -1); !errors.Is(err, ErrNegative) {
		t.Fatalf("negative limit: %v", err)
	}
	if err := m.Set("a", 10); err != nil {
		t.Fatal(err)
	}
	if err := m.Set("", 0); err != nil {
		t.Fatal(err)
	}
	if v, ok := m.Get("a"); v != 10 || !ok {
		t.Fatalf("get a = %d %v", v, ok)
	}
	if v, ok := m.Get(""); v != 0 || !ok {
		t.Fatalf("zero quota must exist: %d %v", v, ok)
	}
	if v, ok := m.Get("b"); v != 0 || ok {
		t.Fatalf("unregistered: %d %v", v, ok)
	}
	if m.LimitBytes("b") != 0 || m.LimitBytes("a") != 10 {
		t.Fatal("allowlist limit wrong")
	}
	if l := m.List(); len(l) != 2 || l["a"] != 10 {
		t.Fatalf("list %v", l)
	}
	if !m.Delete("a") || m.Delete("a") {
		t.Fatal("delete must report existence once")
	}
}

func TestSentinel(t *testing.T) {
	if FromPath("_default") != "" || FromPath("x") != "x" || ToPath("") != "_default" || ToPath("x") != "x" {
		t.Fatal("sentinel mapping")
	}
}

// TestManagerBounded: once MaxQuotas limits are registered a new salt is
// refused with ErrTooMany and nothing changes, while replacing a
// registered limit still works and a delete makes room for a new one.
func TestManagerBounded(t *testing.T) {
	m := New()
	for i := range MaxQuotas {
		if err := m.Set(strconv.Itoa(i), 1); err != nil {
			t.Fatalf("quota %d: %v", i, err)
		}
	}
	if err := m.Set("one-too-many", 1); !errors.Is(err, ErrTooMany) {
		t.Fatalf("quota %d: %v, want ErrTooMany", MaxQuotas+1, err)
	}
	if _, ok := m.Get("one-too-many"); ok || len(m.List()) != MaxQuotas {
		t.Fatalf("refused quota registered anyway (%d quotas)", len(m.List()))
	}
	if err := m.Set("7", 2); err != nil {
		t.Fatalf("replacing a registered limit at the bound: %v", err)
	}
	if !m.Delete("8") {
		t.Fatal("delete of a registered limit reported none")
	}
	if err := m.Set("one-too-many", 1); err != nil {
		t.Fatalf("new salt after a delete: %v", err)
	}
}
