package main

import (
	"io"
	"log/slog"
	"strings"
)

// newLogger builds the process logger; level names follow Python's logging.
func newLogger(format, level string, w io.Writer) *slog.Logger {
	var lv slog.Level
	switch strings.ToUpper(level) {
	case "DEBUG":
		lv = slog.LevelDebug
	case "WARNING", "WARN":
		lv = slog.LevelWarn
	case "ERROR", "CRITICAL":
		lv = slog.LevelError
	default:
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
