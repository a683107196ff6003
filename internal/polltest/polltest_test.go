package polltest

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fatalRecorder stands in for a test that Until fails: it keeps the
// message and ends the goroutine, as t.Fatalf does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls Until on its own goroutine (Fatalf ends it) and returns the
// failure message, empty when Until returned.
func run(t *testing.T, within time.Duration, cond func() bool) string {
	f := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(f, within, "the condition", cond)
	}()
	<-done
	return f.msg
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
