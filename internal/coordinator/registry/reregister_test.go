package registry

import (
	"testing"
	"time"
)

// TestReRegistrationCountsAsHeartbeat: a second POST /instances for the same
// id resets its silence, so the sweep keeps it; without it, it is swept.
func TestReRegistrationCountsAsHeartbeat(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	r := New(clk.now)
	r.Register(Instance{InstanceID: "a", IP: "h", HTTPPort: 1})
	r.Register(Instance{InstanceID: "b", IP: "h", HTTPPort: 1})
	clk.add(20 * time.Second)
	if _, re, _ := r.Register(Instance{InstanceID: "a", IP: "h", HTTPPort: 2}); !re {
		t.Fatal("second registration of a not reported as re_registered")
	}
	clk.add(20 * time.Second) // b silent 40 s, a 20 s
	if gone := r.SweepStale(30 * time.Second); len(gone) != 1 || gone[0] != "b" {
		t.Fatalf("swept %v, want [b]", gone)
	}
	if got := r.LastHeartbeats()["a"]; !got.Equal(time.Unix(1_700_000_020, 0)) {
		t.Fatalf("a's last heartbeat %v, want the re-registration time", got)
	}
	clk.add(11 * time.Second) // a silent 31 s
	if gone := r.SweepStale(30 * time.Second); len(gone) != 1 || gone[0] != "a" {
		t.Fatalf("swept %v, want [a]", gone)
	}
}
