package coordinator

import (
	"sync"
	"time"
)

// warnInterval is how often a throttled WARN (a registry-full refusal, an
// event-gate reset) is logged at most. Both can repeat once per request
// under load (a fleet past the registry's bound re-registering every few
// seconds, a flood of new instance ids), and a line per request says no
// more than the first; the metrics count every occurrence.
const warnInterval = 10 * time.Second

// logThrottle lets one log line through per interval and counts the
// occurrences it held back meanwhile, which the next line reports. Safe for
// concurrent use; the zero value is not usable (see newLogThrottle).
type logThrottle struct {
	mu         sync.Mutex
	every      time.Duration
	now        func() time.Time
	last       time.Time
	logged     bool
	suppressed int64
}

func newLogThrottle(every time.Duration) *logThrottle {
	return &logThrottle{every: every, now: time.Now}
}

// allow reports whether this occurrence is logged and, when it is, how
// many were held back since the last line.
func (t *logThrottle) allow() (ok bool, suppressed int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if t.logged && now.Sub(t.last) < t.every {
		t.suppressed++
		return false, 0
	}
	t.logged, t.last = true, now
	suppressed, t.suppressed = t.suppressed, 0
	return true, suppressed
}

// setClock replaces the throttle's clock (tests).
func (t *logThrottle) setClock(now func() time.Time) {
	t.mu.Lock()
	t.now = now
	t.mu.Unlock()
}
