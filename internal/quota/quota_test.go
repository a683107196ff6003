package quota

import (
	"errors"
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
