package main

import (
	"io"
	"log/slog"

	"github.com/lmcache-go/lmcache/internal/loglevel"
)

// newLogger builds a plain process logger (the coordinator's); level names
// follow Python's logging. An unknown format or level falls back to text
// and INFO, since the callers validated both already.
func newLogger(format, level string, w io.Writer) *slog.Logger {
	h, err := loglevel.NewHandler(w, format)
	if err != nil {
		h, _ = loglevel.NewHandler(w, "text")
	}
	lv, err := loglevel.ParseLevel(level)
	if err != nil {
		lv = slog.LevelInfo
	}
	return loglevel.New(h, lv).Logger("lmcache")
}
