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

// errDeadlineCut marks a call that the caller's deadline ended before S3
// answered it (and before its slow limit); see breaker.cut.
var errDeadlineCut = errors.New("s3: call cut by the caller's deadline")

// breaker is a consecutive-failure circuit breaker. Upstream disables the
// adapter for good after 3 connection failures; this one re-admits a single
// probe request after the cool-down (half-open) and closes again when the
// probe succeeds. All fields are guarded by mu; no I/O happens under it.
//
// Slow calls count as failures: a stalled (not dead) S3 accepts connections
// and answers nothing, so without this every request would wait its whole
// timeout (30 s) before the breaker could learn anything. A call still
// running when its slow limit passes is counted at that moment (slow), not
// when it finally returns, so the breaker opens while the calls still hang.
type breaker struct {
	threshold int
	cooldown  time.Duration
	now       func() time.Time

	mu       sync.Mutex
	state    breakerState
	failures int // consecutive connection-class failures and slow calls
	openedAt time.Time
	probing  bool   // a half-open probe is in flight
	probeID  uint64 // the probe in flight, so a late, superseded one cannot clear probing
	nextID   uint64
	trips    int64
	slows    int64 // calls counted as slow, ever
	// onTrip runs (under mu, so it must not call back into the breaker)
	// each time the breaker opens from closed or half-open.
	onTrip func()
}

func newBreaker(threshold int, cooldown time.Duration, now func() time.Time) *breaker {
	if now == nil {
		now = time.Now
	}
	return &breaker{threshold: threshold, cooldown: cooldown, now: now}
}

// allow admits a request or returns errBroken. A request admitted in the
// half-open state is the probe (probe != 0); it must be followed by record.
func (b *breaker) allow() (probe uint64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case closed:
		return 0, nil
	case open:
		if b.now().Sub(b.openedAt) < b.cooldown {
			return 0, errBroken
		}
		b.state = halfOpen
		return b.startProbe(), nil
	default: // half-open: one probe at a time
		if b.probing {
			return 0, errBroken
		}
		return b.startProbe(), nil
	}
}

func (b *breaker) startProbe() uint64 {
	b.nextID++
	b.probing, b.probeID = true, b.nextID
	return b.probeID
}

// endProbe clears the probe flag if probe is still the one in flight.
func (b *breaker) endProbe(probe uint64) {
	if probe != 0 && b.probeID == probe {
		b.probing = false
	}
}

// fail counts one failure (or slow call) and opens the breaker at the
// threshold, or at once when it was half-open.
func (b *breaker) fail() {
	b.failures++
	if b.state == halfOpen || b.failures >= b.threshold {
		tripped := b.state != open
		if tripped {
			b.trips++
		}
		b.state = open
		b.openedAt = b.now()
		if tripped && b.onTrip != nil {
			b.onTrip()
		}
	}
}

// slow records that an admitted call has run past its slow limit and is
// still running. Its outcome, when it comes, is then ignored (record with
// wasSlow): the slow call already counted as a failure. A slow probe ends
// its probing, so the next cool-down admits a fresh probe even while this
// one hangs.
func (b *breaker) slow(probe uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.slows++
	b.endProbe(probe)
	b.fail()
}

// cut records that a caller's deadline (the engine's lookup budget,
// --l2-lookup-timeout-ms) ended S3 calls before S3 answered them. It counts
// like one slow call: a stall that only lookups see, with a budget shorter
// than the slow-call limit, would otherwise never open the breaker, and
// every lookup would wait its whole budget. The caller reports one cut per
// operation (a lookup's HEADs run in parallel and are one sighting of the
// stall), so it takes threshold consecutive cut lookups to open the
// breaker; in the half-open state a cut probe reopens it at once.
func (b *breaker) cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == open {
		return // already known; counting would only push the probe back
	}
	b.slows++
	b.fail()
}

// record feeds the outcome of an admitted request back. ctx is the
// caller's context: a request the caller cancelled says nothing about S3
// by itself (a deadline that cut it is reported through cut).
// wasSlow: slow already counted this call.
func (b *breaker) record(ctx context.Context, probe uint64, err error, wasSlow bool) {
	neutral := err != nil && ctx.Err() != nil
	b.mu.Lock()
	defer b.mu.Unlock()
	b.endProbe(probe)
	switch {
	case wasSlow:
	case neutral:
		// A cancelled probe lets the next request probe instead.
	case !isConnectionFailure(err):
		b.failures = 0
		b.state = closed
	default:
		b.fail()
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

func (b *breaker) snapshot() (state breakerState, failures int, trips, slows int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.failures, b.trips, b.slows
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
