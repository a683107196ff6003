package s3

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/lmcache-go/lmcache/internal/l2"
)

type breakerState int

const (
	closed breakerState = iota
	open
	halfOpen
)

func (s breakerState) String() string {
	return [...]string{"closed", "open", "half_open"}[s]
}

// errBroken is returned without any request while the breaker is open.
var errBroken = fmt.Errorf("%w: S3 connection disabled (circuit-broken)", l2.ErrUnavailable)

// breaker is a consecutive-failure circuit breaker. Upstream disables the
// adapter for good after 3 connection failures; this one re-admits a single
// probe request after the cool-down (half-open) and closes again when the
// probe succeeds. All fields are guarded by mu; no I/O happens under it.
type breaker struct {
	threshold int
	cooldown  time.Duration
	now       func() time.Time

	mu       sync.Mutex
	state    breakerState
	failures int // consecutive connection-class failures
	openedAt time.Time
	probing  bool // a half-open probe is in flight
	trips    int64
}

func newBreaker(threshold int, cooldown time.Duration, now func() time.Time) *breaker {
	if now == nil {
		now = time.Now
	}
	return &breaker{threshold: threshold, cooldown: cooldown, now: now}
}

// allow admits a request or returns errBroken. A request admitted in the
// half-open state is the probe; it must be followed by record.
func (b *breaker) allow() (probe bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case closed:
		return false, nil
	case open:
		if b.now().Sub(b.openedAt) < b.cooldown {
			return false, errBroken
		}
		b.state = halfOpen
		b.probing = true
		return true, nil
	default: // half-open: one probe at a time
		if b.probing {
			return false, errBroken
		}
		b.probing = true
		return true, nil
	}
}

// record feeds the outcome of an admitted request back. ctx is the
// caller's context: a request the caller cancelled says nothing about S3.
func (b *breaker) record(ctx context.Context, probe bool, err error) {
	neutral := err != nil && ctx.Err() != nil
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case neutral:
		if probe && b.state == halfOpen {
			// Let the next request probe instead.
			return
		}
	case !isConnectionFailure(err):
		b.failures = 0
		b.state = closed
	default:
		b.failures++
		if b.state == halfOpen || b.failures >= b.threshold {
			if b.state != open {
				b.trips++
			}
			b.state = open
			b.openedAt = b.now()
		}
	}
}

// blocked reports whether allow would refuse right now, without claiming
// the half-open probe.
func (b *breaker) blocked() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case open:
		return b.now().Sub(b.openedAt) < b.cooldown
	case halfOpen:
		return b.probing
	}
	return false
}

func (b *breaker) snapshot() (state breakerState, failures int, trips int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.failures, b.trips
}

// isConnectionFailure classifies an S3 call outcome. Anything that got an
// HTTP answer below 500 (including 404 and 403) proves S3 is reachable;
// 5xx answers and errors without any HTTP response (refused, reset, DNS,
// TLS, timeouts) count toward opening the breaker.
func isConnectionFailure(err error) bool {
	if err == nil {
		return false
	}
	var nf *notFound
	if errors.As(err, &nf) {
		return false
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		// The SDK wraps transport errors in a ResponseError with status 0.
		code := re.HTTPStatusCode()
		return code == 0 || code >= 500
	}
	return true
}
