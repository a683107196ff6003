package loglevel

import (
	"bytes"
	"log/slog"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestUpstreamLogLineShape checks --log-format upstream byte for byte
// against upstream's lmcache/logging.py format:
// "<colour>[%(asctime)s] LMCache %(levelname)s:<reset> %(message)s <italic>(%(filename)s:%(lineno)d:%(name)s)<reset>".
func TestUpstreamLogLineShape(t *testing.T) {
	var buf bytes.Buffer
	h := newUpstreamHandler(&buf, time.UTC)
	reg := New(h, slog.LevelDebug)
	log := reg.Logger("lmcache.engine")
	at := time.Date(2026, 12, 1, 20, 10, 5, 123456789, time.UTC)
	for _, c := range []struct {
		level  slog.Level
		colour string
		name   string
	}{
		{slog.LevelDebug, "\x1b[1m", "DEBUG"},
		{slog.LevelInfo, "\x1b[32;20m", "INFO"},
		{slog.LevelWarn, "\x1b[33;20m", "WARNING"},
		{slog.LevelError, "\x1b[31;20m", "ERROR"},
		{LevelCritical, "\x1b[31;1m", "CRITICAL"},
	} {
		buf.Reset()
		var pcs [1]uintptr
		runtime.Callers(1, pcs[:])
		_, line := callerLine(pcs[0])
		r := slog.NewRecord(at, c.level, "stored 3 chunks", pcs[0])
		r.AddAttrs(slog.String("salt", "a b"), slog.Int("n", 7), slog.Group("g", slog.Bool("ok", true)))
		if err := log.Handler().Handle(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		want := c.colour + "[2026-12-01 20:10:05,123] LMCache " + c.name + ":\x1b[0m stored 3 chunks salt=\"a b\" n=7 g.ok=true \x1b[3m(upstream_test.go:" +
			strconv.Itoa(line) + ":lmcache.engine)\x1b[0m\n"
		if got := buf.String(); got != want {
			t.Errorf("%s line\n got %q\nwant %q", c.name, got, want)
		}
	}
}

func callerLine(pc uintptr) (string, int) {
	f, _ := runtime.CallersFrames([]uintptr{pc}).Next()
	return f.File, f.Line
}

// TestUpstreamLogThroughLogger goes through slog.Logger, as the binary
// does: levels filtered by the registry, source from the call site, the
// With attributes, and whole lines under concurrency.
func TestUpstreamLogThroughLogger(t *testing.T) {
	var buf bytes.Buffer
	h, err := NewHandler(&buf, "upstream")
	if err != nil {
		t.Fatal(err)
	}
	log := New(h, slog.LevelInfo).Logger("lmcache").With("tenant", "t1")
	log.Debug("hidden")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); log.Info("hello", "i", i) }()
	}
	wg.Wait()
	line := regexp.MustCompile(`^\x1b\[32;20m\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] LMCache INFO:\x1b\[0m hello tenant=t1 i=\d \x1b\[3m\(upstream_test\.go:\d+:lmcache\)\x1b\[0m$`)
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 8 {
		t.Fatalf("%d lines, want 8:\n%q", len(lines), buf.String())
	}
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Errorf("line %q does not have upstream's shape", l)
		}
	}
}
