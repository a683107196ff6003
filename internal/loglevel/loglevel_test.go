package loglevel

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
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
