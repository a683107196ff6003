package loglevel

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPerLoggerLevels(t *testing.T) {
	var buf bytes.Buffer
	h, err := NewHandler(&buf, "json")
	if err != nil {
		t.Fatal(err)
	}
	r := New(h, slog.LevelInfo)
	eng := r.Logger("lmcache.engine")
	other := r.Logger("other")
	eng.Debug("hidden")
	if buf.Len() != 0 {
		t.Fatalf("debug logged at INFO: %s", buf.String())
	}
	if _, err := r.Set("lmcache", "debug"); err != nil {
		t.Fatal(err)
	}
	eng.Debug("shown", "k", 1)
	other.Debug("still hidden")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("one JSON record expected: %q", buf.String())
	}
	if rec["msg"] != "shown" || rec["level"] != "DEBUG" || rec["logger"] != "lmcache.engine" {
		t.Fatalf("record = %v", rec)
	}
	if Name(r.Effective("lmcache.engine.sub")) != "DEBUG" || Name(r.Effective("other")) != "INFO" {
		t.Fatal("inheritance broken")
	}
	if _, err := r.Set("x", "LOUD"); !errors.Is(err, ErrUnknownLevel) {
		t.Fatalf("LOUD: %v", err)
	}
	if l, _ := r.Set("crit", "critical"); Name(l) != "CRITICAL" {
		t.Fatal("critical")
	}
	var names []string
	for _, e := range r.List() {
		names = append(names, e.Name+"="+Name(e.Level))
	}
	if got := strings.Join(names, " "); got != "crit=CRITICAL lmcache=DEBUG lmcache.engine=DEBUG other=INFO root=INFO" {
		t.Fatalf("list = %s", got)
	}
	if _, err := NewHandler(&buf, "xml"); err == nil {
		t.Fatal("xml format accepted")
	}
	buf.Reset()
	th, _ := NewHandler(&buf, "text")
	New(th, slog.LevelWarn).Logger("a").Warn("w")
	if !strings.Contains(buf.String(), "level=WARNING") || !strings.Contains(buf.String(), "logger=a") {
		t.Fatalf("text record = %q", buf.String())
	}
}

// TestSetBoundsNewLoggers: Set creates loggers up to MaxLoggers in all;
// past that a new name is ErrTooManyLoggers (and not created) while a
// known one still changes level, so a client sending ever new names to
// GET /loglevel cannot grow the registry without bound.
func TestSetBoundsNewLoggers(t *testing.T) {
	h, err := NewHandler(&bytes.Buffer{}, "text")
	if err != nil {
		t.Fatal(err)
	}
	r := New(h, slog.LevelInfo)
	for i := len(r.List()); i < MaxLoggers; i++ {
		if _, err := r.Set("x"+strconv.Itoa(i), "debug"); err != nil {
			t.Fatalf("logger %d of %d: %v", i+1, MaxLoggers, err)
		}
	}
	if _, err := r.Set("one-too-many", "debug"); !errors.Is(err, ErrTooManyLoggers) {
		t.Fatalf("logger %d: %v, want ErrTooManyLoggers", MaxLoggers+1, err)
	}
	if n := len(r.List()); n != MaxLoggers {
		t.Fatalf("%d loggers, want %d", n, MaxLoggers)
	}
	if l, err := r.Set("x"+strconv.Itoa(MaxLoggers-1), "error"); err != nil || l != slog.LevelError {
		t.Fatalf("known logger: %v %v", l, err)
	}
}

// TestSetBoundsNameLength: Set refuses a name past MaxNameBytes with
// ErrNameTooLong and creates nothing; a name of exactly the bound is set.
func TestSetBoundsNameLength(t *testing.T) {
	h, err := NewHandler(&bytes.Buffer{}, "text")
	if err != nil {
		t.Fatal(err)
	}
	r := New(h, slog.LevelInfo)
	before := len(r.List())
	long := strings.Repeat("n", MaxNameBytes+1)
	if _, err := r.Set(long, "debug"); !errors.Is(err, ErrNameTooLong) {
		t.Fatalf("Set of a %d-byte name: %v, want ErrNameTooLong", len(long), err)
	}
	if n := len(r.List()); n != before {
		t.Fatalf("%d loggers after the refused Set, want %d", n, before)
	}
	if l, err := r.Set(long[:MaxNameBytes], "debug"); err != nil || l != slog.LevelDebug {
		t.Fatalf("Set of a %d-byte name: %v, %v", MaxNameBytes, l, err)
	}
}
