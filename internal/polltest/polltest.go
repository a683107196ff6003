// Package polltest waits in tests for a condition that another goroutine
// or process makes true: a server that starts listening, a loop that
// finishes a cycle, a metric that reaches a value.
//
// The deadline only bounds a failing test; it is not a timing assertion,
// so it is generous, and a passing test returns as soon as the condition
// holds. Polls start 1 ms apart and back off to 50 ms, so a fast
// condition costs little latency and a slow one (a child process, an etcd
// election) little CPU on a small machine running many tests at once.
package polltest

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Poll intervals: the first, and the most the back-off grows to.
const (
	firstPoll = time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// Until calls cond until it returns true, and fails t (Fatalf, naming
// what) if within passes first. cond runs on the caller's goroutine, so
// it may use t itself.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	wait := firstPoll
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(wait)
		wait = min(2*wait, maxPoll)
	}
}

// FailureOf runs f on a goroutine of its own with a testing.TB whose
// Fatalf records the message and ends that goroutine, as t.Fatalf does,
// and returns the message ("" when f returned without failing). It tests
// helpers that fail their test, such as Until; the recorder's other
// methods are t's.
func FailureOf(t testing.TB, f func(testing.TB)) string {
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(rec)
	}()
	<-done
	return rec.msg
}

// fatalRecorder is FailureOf's testing.TB.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
