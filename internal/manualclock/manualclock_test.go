package manualclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/manualclock"
)

// TestAdvance: the clock reads its start until advanced, then exactly the
// sum of the advances, also when advanced and read concurrently.
func TestAdvance(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := manualclock.New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Second)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(400*time.Second); !got.Equal(want) {
		t.Fatalf("Now = %v, want %v", got, want)
	}
}
