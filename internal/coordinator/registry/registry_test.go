package registry

import (
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestRegistry is research 10.2 and 10.3 (evict_stale) against the package.
func TestRegistry(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	r := New(clk.now)
	if _, ok := r.Get("a"); ok {
		t.Fatal("empty registry has a")
	}
	if _, re, _ := r.Register(Instance{InstanceID: "a", IP: "h", HTTPPort: 1}); re {
		t.Fatal("first registration reported re_registered")
	}
	// List and Get hand out copies: writing to one changes nothing inside.
	snap := r.List()
	snap[0].Metadata["k"] = "v"
	snap[0].IP = "other"
	if got, _ := r.Get("a"); got.IP != "h" || len(got.Metadata) != 0 {
		t.Fatalf("a List result aliases the registry: %+v", got)
	}
	r.Register(Instance{InstanceID: "b", IP: "h", HTTPPort: 2})
	if !r.Heartbeat("a") || r.Heartbeat("zz") {
		t.Fatal("heartbeat known/unknown")
	}
	clk.add(100 * time.Second)
	r.Heartbeat("b")
	if gone := r.SweepStale(30 * time.Second); len(gone) != 1 || gone[0] != "a" {
		t.Fatalf("stale %v", gone)
	}
	if gone := r.SweepStale(30 * time.Second); len(gone) != 0 {
		t.Fatalf("fresh entries swept: %v", gone)
	}
	// Exactly at the timeout is not stale (strictly greater).
	clk.add(30 * time.Second)
	if gone := r.SweepStale(30 * time.Second); len(gone) != 0 {
		t.Fatalf("swept at exactly the timeout: %v", gone)
	}
	if !r.Deregister("b") || r.Deregister("b") {
		t.Fatal("deregister twice")
	}
	if _, ok := r.Random(); ok {
		t.Fatal("random from an empty registry")
	}
	in, _, _ := r.Register(Instance{IP: "h", HTTPPort: 1})
	if len(in) != 35 || in[:3] != "mp-" {
		t.Fatalf("generated id %q", in)
	}
	got, _ := r.Get(in)
	if got.RegistrationTime != 1_700_000_130 || got.Metadata == nil {
		t.Fatalf("entry %+v", got)
	}
}
