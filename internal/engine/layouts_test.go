package engine

import (
	"errors"
	"testing"
)

// TestLayoutReferenceCounts: a registration layout lives while any
// registration holds it; a static layout (--register-model) outlives every
// registration and is in force again once the last one is released.
func TestLayoutReferenceCounts(t *testing.T) {
	e, err := New(Config{L1SizeBytes: 1 << 20}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeChecked(t, e)
	size := func(model string) int64 {
		t.Helper()
		l, err := e.Layout(model, 1)
		if errors.Is(err, ErrNoLayout) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return l.ObjectBytes
	}
	if err := e.AcquireLayout(Layout{ModelName: "w", WorldSize: 1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("AcquireLayout without object bytes: %v", err)
	}
	for range 2 {
		if err := e.AcquireLayout(Layout{ModelName: "w", WorldSize: 1, ObjectBytes: 64}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.ReleaseLayout("w", 1); got != 1 || size("w") != 64 {
		t.Fatalf("after one of two releases: %d refs left, size %d; want 1 and 64", got, size("w"))
	}
	if got := e.ReleaseLayout("w", 1); got != 0 || size("w") != 0 || len(e.Layouts()) != 0 {
		t.Fatalf("after the last release: %d refs, size %d, layouts %+v; want none", got, size("w"), e.Layouts())
	}
	if got := e.ReleaseLayout("w", 1); got != 0 {
		t.Fatalf("release without a reference = %d", got)
	}

	if err := e.RegisterLayout(Layout{ModelName: "s", WorldSize: 1, ObjectBytes: 32}); err != nil {
		t.Fatal(err)
	}
	if err := e.AcquireLayout(Layout{ModelName: "s", WorldSize: 1, ObjectBytes: 48}); err != nil {
		t.Fatal(err)
	}
	if ls := e.Layouts(); size("s") != 48 || len(ls) != 1 || ls[0].ObjectBytes != 48 {
		t.Fatalf("registration over a static layout: size %d, layouts %+v; want the registration's 48 only", size("s"), ls)
	}
	if e.ReleaseLayout("s", 1); size("s") != 32 {
		t.Fatalf("after the registration's release: size %d, want the static 32", size("s"))
	}
	if !e.UnregisterLayout("s", 1) || size("s") != 0 {
		t.Fatal("static layout not unregistered")
	}
}
