package polltest

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run calls Until on its own goroutine (Fatalf ends it) and returns the
// failure message, empty when Until returned.
func run(t *testing.T, within time.Duration, cond func() bool) string {
	return FailureOf(t, func(tb testing.TB) { Until(tb, within, "the condition", cond) })
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	if msg := run(t, time.Minute, func() bool { calls++; return calls == 3 }); msg != "" {
		t.Fatalf("Until failed: %s", msg)
	}
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3 (it held on the third)", calls)
	}
}

func TestUntilFailsAtTheDeadline(t *testing.T) {
	calls := 0
	msg := run(t, 20*time.Millisecond, func() bool { calls++; return false })
	if want := "timed out after 20ms waiting for the condition"; msg != want {
		t.Fatalf("failure %q, want %q", msg, want)
	}
	if calls < 2 {
		t.Fatalf("cond called %d times before the deadline, want at least 2", calls)
	}
}
