package l2_test

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
)

// statusAdapter is an adapter whose Status reports a fixed map (the other
// methods are never called: the embedded nil interface would panic).
type statusAdapter struct {
	l2.Adapter
	status map[string]any
}

func (s statusAdapter) Status() map[string]any { return s.status }

// wrapper forwards Status as the tracing and fault wrappers do.
type wrapper struct{ l2.Adapter }

// TestBreakerStateOf maps each Status breaker_state to the gauge value,
// through a forwarding wrapper too, and reports adapters without a breaker
// as closed.
func TestBreakerStateOf(t *testing.T) {
	for _, c := range []struct {
		status map[string]any
		want   l2.BreakerState
	}{
		{map[string]any{"breaker_state": "closed"}, 0},
		{map[string]any{"breaker_state": "open"}, 1},
		{map[string]any{"breaker_state": "half_open"}, 2},
		{map[string]any{"type": "FSL2Adapter"}, 0},
	} {
		a := statusAdapter{status: c.status}
		if got := l2.BreakerStateOf(a); got != c.want {
			t.Errorf("BreakerStateOf(%v) = %d, want %d", c.status, got, c.want)
		}
		if got := l2.BreakerStateOf(wrapper{a}); got != c.want {
			t.Errorf("BreakerStateOf(wrapped %v) = %d, want %d", c.status, got, c.want)
		}
	}
}
