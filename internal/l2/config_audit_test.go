package l2_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/lmcache-go/lmcache/internal/l2"
	// The four adapters the server registers; zz_dummy is this package's.
	_ "github.com/lmcache-go/lmcache/internal/l2/dax"
	_ "github.com/lmcache-go/lmcache/internal/l2/fault"
	_ "github.com/lmcache-go/lmcache/internal/l2/fs"
	_ "github.com/lmcache-go/lmcache/internal/l2/s3"
)

func TestRegisteredTypesExact(t *testing.T) {
	if d := cmp.Diff([]string{"dax", "fault_inject", "fs", "s3", "zz_dummy"}, l2.RegisteredTypes()); d != "" {
		t.Fatalf("registered types (-want +got):\n%s", d)
	}
	_, err := l2.ParseSpec(1, []byte(`{"type":"x"}`))
	const want = "invalid --l2-adapter: --l2-adapter #1: unknown adapter type 'x'. Known: dax, fault_inject, fs, s3, zz_dummy"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestEvictionBlockDefaultsAndBounds(t *testing.T) {
	spec, err := l2.ParseSpec(1, []byte(`{"type":"zz_dummy","path":"/a","eviction":{"eviction_policy":"LRU"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&l2.EvictionConfig{Policy: "LRU", TriggerWatermark: 0.8, EvictionRatio: 0.2}, spec.Eviction); d != "" {
		t.Fatalf("eviction (-want +got):\n%s", d)
	}
	spec, err = l2.ParseSpec(1, []byte(`{"type":"zz_dummy","path":"/a","eviction":{"eviction_policy":"noop","trigger_watermark":1,"eviction_ratio":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&l2.EvictionConfig{Policy: "noop", TriggerWatermark: 1, EvictionRatio: 1}, spec.Eviction); d != "" {
		t.Fatalf("eviction at the upper bounds (-want +got):\n%s", d)
	}
	for _, c := range []struct{ block, want string }{
		{`{"eviction_policy":"LRU","trigger_watermark":0}`, "eviction.trigger_watermark must be in (0, 1], got 0"},
		{`{"eviction_policy":"LRU","trigger_watermark":1.5}`, "eviction.trigger_watermark must be in (0, 1], got 1.5"},
		{`{"eviction_policy":"LRU","trigger_watermark":-0.1}`, "eviction.trigger_watermark must be in (0, 1], got -0.1"},
		{`{"eviction_policy":"LRU","eviction_ratio":0}`, "eviction.eviction_ratio must be in (0, 1], got 0"},
		{`{"eviction_policy":"LRU","watermark":0.5}`, "eviction: unknown keys watermark"},
	} {
		_, err := l2.ParseSpec(1, []byte(`{"type":"zz_dummy","path":"/a","eviction":`+c.block+`}`))
		want := "--l2-adapter #1 ('zz_dummy'): " + c.want
		if err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%s: got %v, want suffix %q", c.block, err, want)
		}
	}
}

// Not parallel: it swaps the default slog logger, which ParseSpec logs to.
func TestUnknownKeysLoggedAsWarning(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })

	spec, err := l2.ParseSpec(3, []byte(`{"type":"zz_dummy","path":"/a","mystery":1,"also":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"also", "mystery"}, spec.UnknownKeys); d != "" {
		t.Fatalf("UnknownKeys (-want +got):\n%s", d)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one log line, got %q", buf.String())
	}
	for _, want := range []string{`level=WARN`, `msg="ignoring unknown --l2-adapter keys"`, `index=3`, `type=zz_dummy`, `keys="[also mystery]"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("log line %q lacks %q", lines[0], want)
		}
	}

	buf.Reset()
	if _, err := l2.ParseSpec(1, []byte(`{"type":"zz_dummy","path":"/a"}`)); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 0 {
		t.Fatalf("no unknown keys, yet logged %q", buf.String())
	}
}
