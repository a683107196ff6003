package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/loglevel"
)

// TestLogFormatChoice: every format the flag tables accept builds the
// process's handler, and an unknown one is an error naming them.
func TestLogFormatChoice(t *testing.T) {
	for _, f := range []string{"text", "json", "upstream", "UPSTREAM"} {
		if _, err := loglevel.NewHandler(&bytes.Buffer{}, f); err != nil {
			t.Errorf("newHandler(%q) = %v", f, err)
		}
	}
	if _, err := loglevel.NewHandler(&bytes.Buffer{}, "xml"); err == nil || !strings.Contains(err.Error(), "text, json, upstream") {
		t.Errorf("newHandler(xml) = %v, want an error naming the formats", err)
	}
	// The coordinator's format comes from its flag table (LMCACHE_LOG_FORMAT,
	// case ignored); every value it accepts builds a handler.
	for v, want := range map[string]string{"": "text", "Upstream": "upstream", "JSON": "json"} {
		e := map[string]string{}
		if v != "" {
			e["LMCACHE_LOG_FORMAT"] = v
		}
		cfg, err := config.Load(nil, func(k string) (string, bool) { x, ok := e[k]; return x, ok }, io.Discard)
		if err != nil || cfg.LogFormat != want {
			t.Errorf("LMCACHE_LOG_FORMAT=%q: %q %v, want %q", v, cfg.LogFormat, err, want)
			continue
		}
		if _, err := loglevel.NewHandler(&bytes.Buffer{}, cfg.LogFormat); err != nil {
			t.Errorf("newHandler(%q) = %v", cfg.LogFormat, err)
		}
	}
}
