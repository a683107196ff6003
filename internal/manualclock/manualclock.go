// Package manualclock is a clock that moves only when told to, for tests
// of time-driven state (the S3 circuit breaker's cool-down) that must not
// depend on the wall clock or on sleeps.
package manualclock

import (
	"sync"
	"time"
)

// Clock is a manual clock, safe for concurrent use: Now is read by the
// code under test while the test goroutine calls Advance.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's current time (a func() time.Time for config hooks).
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
