// Package logthrottle rate-limits repeated log lines: the one place the
// services decide whether a WARN that can repeat once per request (a full
// registry, a refused peer, a failing publisher) is written this time.
//
// A condition that repeats says nothing new after its first line, and a
// line per occurrence floods the log exactly when the service is under
// stress. Every throttled occurrence is still counted in a metric by the
// caller; the throttle only decides about the line, and tells the next
// line how many it held back.
package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter lets through, per key, the first occurrence and then at most one
// per interval, counting the occurrences it held back. Keys are the
// callers' (a kind of condition, often with a peer in it), so a server
// whose keys name clients calls Forget now and then to bound the map. Safe
// for concurrent use.
type Limiter struct {
	mu   sync.Mutex
	now  func() time.Time
	keys map[string]*state
}

type state struct {
	last       time.Time // when the last line of the key was let through
	suppressed int64     // occurrences held back since then
}

// New returns a Limiter on the wall clock.
func New() *Limiter {
	return &Limiter{now: time.Now, keys: map[string]*state{}}
}

// SetClock replaces the limiter's clock (tests drive it by hand).
func (l *Limiter) SetClock(now func() time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.now = now
}

// Allow reports whether this occurrence of key is logged: the first one is,
// and then one at most every interval. When it is, suppressed is the number
// of occurrences held back since the key's last line (0 for the first).
func (l *Limiter) Allow(key string, every time.Duration) (ok bool, suppressed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	s := l.keys[key]
	if s == nil {
		l.keys[key] = &state{last: now}
		return true, 0
	}
	if now.Sub(s.last) < every {
		s.suppressed++
		return false, 0
	}
	suppressed, s.suppressed, s.last = s.suppressed, 0, now
	return true, suppressed
}

// Log writes msg at level to logger if Allow lets key through, adding
// "suppressed" with the number held back since the key's last line when
// there were any.
func (l *Limiter) Log(logger *slog.Logger, level slog.Level, key string, every time.Duration, msg string, args ...any) {
	ok, held := l.Allow(key, every)
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	logger.Log(context.Background(), level, msg, args...)
}

// Forget drops the keys whose last line is older than age; a later
// occurrence of one is logged as a first one. It returns how many keys are
// left.
func (l *Limiter) Forget(age time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	for k, s := range l.keys {
		if now.Sub(s.last) > age {
			delete(l.keys, k)
		}
	}
	return len(l.keys)
}
