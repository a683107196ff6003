package s3

import (
	"testing"
	"time"
)

// TestSlowLimitAndTransferTimeout: with the default config a call counts as
// slow after 2 s plus 100 ms per whole MiB of body, and a PUT/GET times out
// after 30 s plus 1 s per whole MiB.
func TestSlowLimitAndTransferTimeout(t *testing.T) {
	a := &Adapter{cfg: Defaults()}
	for _, c := range []struct {
		n          int
		slow, xfer time.Duration
	}{
		{0, 2 * time.Second, 30 * time.Second},
		{1<<20 - 1, 2 * time.Second, 30 * time.Second},
		{1 << 20, 2100 * time.Millisecond, 31 * time.Second},
		{10 << 20, 3 * time.Second, 40 * time.Second},
		{64<<20 + 5, 8400 * time.Millisecond, 94 * time.Second},
	} {
		if got := a.slowLimit(c.n); got != c.slow {
			t.Errorf("slowLimit(%d) = %v, want %v", c.n, got, c.slow)
		}
		if got := a.transferTimeout(c.n); got != c.xfer {
			t.Errorf("transferTimeout(%d) = %v, want %v", c.n, got, c.xfer)
		}
	}
}

// TestDeleteSlowLimitScalesWithKeys: a DeleteObjects batch counts as slow
// after 2 s plus 2 ms per key (4 s for a full batch of 1000), not after the
// plain 2 s that a healthy large batch can exceed.
func TestDeleteSlowLimitScalesWithKeys(t *testing.T) {
	a := &Adapter{cfg: Defaults()}
	for n, want := range map[int]time.Duration{1: 2002 * time.Millisecond, 500: 3 * time.Second, deleteBatch: 4 * time.Second} {
		if got := a.deleteSlowLimit(n); got != want {
			t.Errorf("deleteSlowLimit(%d) = %v, want %v", n, got, want)
		}
	}
}
