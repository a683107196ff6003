package l2

// BreakerState is an adapter's circuit-breaker state as the
// lmcache_mp_l2_breaker_state gauge reports it: 0 closed (calls flow),
// 1 open (calls fail at once without a request), 2 half-open (one probe
// call decides whether the breaker closes again).
type BreakerState int

// The breaker states, with the gauge's values.
const (
	BreakerClosed   BreakerState = 0
	BreakerOpen     BreakerState = 1
	BreakerHalfOpen BreakerState = 2
)

// StatusBreakerKey is the Status() key under which an adapter with a
// circuit breaker reports its state ("closed", "open" or "half_open").
const StatusBreakerKey = "breaker_state"

// BreakerStateOf reads a's breaker state from its Status() report, so that
// wrappers which forward Status (tracing, fault injection) report the
// wrapped adapter's breaker. An adapter without a breaker is closed.
func BreakerStateOf(a Adapter) BreakerState {
	switch s, _ := a.Status()[StatusBreakerKey].(string); s {
	case "open":
		return BreakerOpen
	case "half_open":
		return BreakerHalfOpen
	}
	return BreakerClosed
}
