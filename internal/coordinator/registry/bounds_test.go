package registry

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRegisterBounded: a new instance past the count or the byte bound is
// refused with ErrFull and nothing changes; a known id re-registers, and a
// slot freed by a deregistration takes a new one. Before, the registry took
// every registration, so anyone who could reach POST /instances grew it
// without limit (and for good with the sweep off).
func TestRegisterBounded(t *testing.T) {
	r := New(nil)
	r.SetLimits(2, 1<<20)
	for _, id := range []string{"a", "b"} {
		if _, _, err := r.Register(Instance{InstanceID: id, IP: "h", HTTPPort: 1}); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	if id, _, err := r.Register(Instance{InstanceID: "c", IP: "h", HTTPPort: 1}); !errors.Is(err, ErrFull) || id != "" {
		t.Fatalf("third instance = %q, %v; want ErrFull", id, err)
	}
	if _, re, err := r.Register(Instance{InstanceID: "a", IP: "h2", HTTPPort: 2}); err != nil || !re {
		t.Fatalf("re-register a = %v, %v; want re-registered", re, err)
	}
	r.Deregister("b")
	if _, _, err := r.Register(Instance{InstanceID: "c", IP: "h", HTTPPort: 1}); err != nil {
		t.Fatalf("register c after b left: %v", err)
	}
	if got := r.Len(); got != 2 {
		t.Fatalf("Len = %d, want 2", got)
	}

	r = New(nil)
	r.SetLimits(100, 4096)
	big := map[string]string{"k": strings.Repeat("v", 5000)}
	if _, _, err := r.Register(Instance{InstanceID: "fat", IP: "h", HTTPPort: 1, Metadata: big}); !errors.Is(err, ErrFull) {
		t.Fatalf("5 KB registration under a 4 KiB bound = %v, want ErrFull", err)
	}
	if _, _, err := r.Register(Instance{InstanceID: "a", IP: "h", HTTPPort: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Register(Instance{InstanceID: "a", IP: "h", HTTPPort: 1, Metadata: big}); !errors.Is(err, ErrFull) {
		t.Fatalf("growing a past the bound = %v, want ErrFull", err)
	}
	if in, ok := r.Get("a"); !ok || len(in.Metadata) != 0 {
		t.Fatalf("refused re-registration changed a: %+v", in)
	}
	// The bytes of swept and deregistered entries are given back.
	for i := range 100 {
		id := fmt.Sprintf("id-%d", i)
		if _, _, err := r.Register(Instance{InstanceID: id, IP: "h", HTTPPort: 1}); err != nil {
			if !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			break
		}
		r.Deregister(id)
	}
	if r.bytes != size(&Instance{InstanceID: "a", IP: "h", Metadata: map[string]string{}}) {
		t.Fatalf("bytes %d after registering and deregistering, want a's alone", r.bytes)
	}
}

// TestSweepManyStale: sweeping n stale instances is one pass over the
// fleet. Before, each removal scanned and copied the order list, so a
// sweep of 200,000 stale instances (registered by anyone, all dropped at
// once) held the registry lock for n² steps: minutes, with heartbeats and
// eviction dispatch blocked behind it.
func TestSweepManyStale(t *testing.T) {
	now := time.Unix(1000, 0)
	r := New(func() time.Time { return now })
	const n = 200_000
	r.SetLimits(n+1, 1<<30)
	for i := range n {
		if _, _, err := r.Register(Instance{InstanceID: fmt.Sprintf("mp-%06d", i), IP: "h", HTTPPort: 1}); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(time.Hour)
	r.Register(Instance{InstanceID: "live", IP: "h", HTTPPort: 1})
	done := make(chan []string, 1)
	go func() { done <- r.SweepStale(time.Minute) }()
	select {
	case gone := <-done:
		if len(gone) != n || gone[0] != "mp-000000" || gone[n-1] != fmt.Sprintf("mp-%06d", n-1) {
			t.Fatalf("swept %d ids", len(gone))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sweeping 200,000 stale instances took over 20 s")
	}
	if l := r.List(); len(l) != 1 || l[0].InstanceID != "live" || r.bytes != size(&Instance{InstanceID: "live", IP: "h", Metadata: map[string]string{}}) {
		t.Fatalf("after the sweep: %d instances, %d bytes; want live alone", len(l), r.bytes)
	}
}
