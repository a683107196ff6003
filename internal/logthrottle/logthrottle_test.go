package logthrottle

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/manualclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAllowOncePerInterval: per key, the first occurrence is logged, the
// next ones within the interval are held back and counted, and the first
// one after it is logged carrying that count; keys do not share intervals.
func TestAllowOncePerInterval(t *testing.T) {
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	l := New()
	l.SetClock(clk.Now)
	type step struct {
		advance    time.Duration
		key        string
		ok         bool
		suppressed int64
	}
	steps := []step{
		{0, "a", true, 0},
		{time.Second, "a", false, 0},
		{time.Second, "a", false, 0},
		{0, "b", true, 0},
		{8*time.Second - time.Nanosecond, "a", false, 0}, // 10 s - 1 ns after a's line
		{time.Nanosecond, "a", true, 3},
		{0, "a", false, 0},
		{10 * time.Second, "a", true, 1},
		{0, "b", true, 0}, // b's interval (from t=2 s) is over; nothing held back
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		ok, n := l.Allow(s.key, 10*time.Second)
		if ok != s.ok || n != s.suppressed {
			t.Fatalf("step %d (%s at %v): Allow = %v, %d; want %v, %d", i, s.key, clk.Now().Sub(time.Unix(1_700_000_000, 0)), ok, n, s.ok, s.suppressed)
		}
	}
}

// TestForget: keys whose last line is older than the age are dropped (and
// their next occurrence is a first one again); younger keys stay.
func TestForget(t *testing.T) {
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	l := New()
	l.SetClock(clk.Now)
	l.Allow("old", time.Hour)
	clk.Advance(30 * time.Minute)
	l.Allow("young", time.Hour)
	l.Allow("old", time.Hour) // held back: does not refresh old's line
	clk.Advance(31 * time.Minute)
	if left := l.Forget(time.Hour); left != 1 {
		t.Fatalf("Forget(1h) left %d keys, want 1 (young)", left)
	}
	if ok, n := l.Allow("old", time.Hour); !ok || n != 0 {
		t.Fatalf("old after Forget: Allow = %v, %d; want a first line (true, 0)", ok, n)
	}
	if ok, _ := l.Allow("young", time.Hour); ok {
		t.Fatal("young within its hour was let through after Forget")
	}
}

// TestLogAddsSuppressed: Log writes the first line, holds back the next
// within the interval, and the line after the interval carries how many
// were held back; a line with none held back has no suppressed field.
func TestLogAddsSuppressed(t *testing.T) {
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	l := New()
	l.SetClock(clk.Now)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	for range 3 {
		l.Log(logger, slog.LevelWarn, "k", 10*time.Second, "full", "peer", "p1")
	}
	clk.Advance(10 * time.Second)
	l.Log(logger, slog.LevelWarn, "k", 10*time.Second, "full", "peer", "p1")
	want := "level=WARN msg=full peer=p1\nlevel=WARN msg=full peer=p1 suppressed=2\n"
	if got := buf.String(); got != want {
		t.Fatalf("log\n%s\nwant\n%s", got, want)
	}
}
