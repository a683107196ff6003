// Package loglevel gives slog per-named-logger levels, the way Python's
// logging module lets /loglevel read and set the level of "lmcache.x.y".
// Names are dotted; a logger without its own level inherits the nearest
// ancestor's, and the root ("root") has the process-wide level.
package loglevel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
)

// LevelCritical is Python's CRITICAL, above slog's ERROR.
const LevelCritical = slog.LevelError + 4

// RootName is the name of the root logger.
const RootName = "root"

// ErrUnknownLevel is returned for a level name outside DEBUG, INFO, WARNING,
// ERROR, CRITICAL (and the aliases WARN and FATAL, as Python).
var ErrUnknownLevel = errors.New("unknown log level")

// ParseLevel parses a Python level name, case-insensitively.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "DEBUG":
		return slog.LevelDebug, nil
	case "INFO":
		return slog.LevelInfo, nil
	case "WARNING", "WARN":
		return slog.LevelWarn, nil
	case "ERROR":
		return slog.LevelError, nil
	case "CRITICAL", "FATAL":
		return LevelCritical, nil
	}
	return 0, fmt.Errorf("%w: %q (want DEBUG, INFO, WARNING, ERROR or CRITICAL)", ErrUnknownLevel, s)
}

// Name is the Python name of a level.
func Name(l slog.Level) string {
	switch {
	case l >= LevelCritical:
		return "CRITICAL"
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	}
	return "DEBUG"
}

// Formats are the values of --log-format / LMCACHE_LOG_FORMAT, which both
// flag tables (serverconfig, coordinator/config) check before a handler is
// built: slog's text and JSON, and "upstream", the lines of upstream's
// lmcache/logging.py (upstream.go).
var Formats = []string{"text", "json", "upstream"}

// NewHandler returns the process's base handler writing to w in one of
// Formats (case ignored; "" is text). It lets every record through; levels
// are applied per logger by the Registry.
func NewHandler(w io.Writer, format string) (slog.Handler, error) {
	opts := &slog.HandlerOptions{Level: slog.Level(-100), ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.LevelKey {
			if l, ok := a.Value.Any().(slog.Level); ok {
				a.Value = slog.StringValue(Name(l))
			}
		}
		return a
	}}
	switch strings.ToLower(format) {
	case "", "text":
		return slog.NewTextHandler(w, opts), nil
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	case "upstream":
		return newUpstreamHandler(w, time.Local), nil
	}
	return nil, fmt.Errorf("log format %q: want one of %s", format, strings.Join(Formats, ", "))
}

// Registry holds the named loggers and their levels. It is safe for
// concurrent use; a level change takes effect on the next record.
type Registry struct {
	base slog.Handler

	mu     sync.RWMutex
	levels map[string]*slog.LevelVar // loggers that were created or set
	set    map[string]bool           // loggers with an explicit level
}

// New returns a registry whose root level is root.
func New(base slog.Handler, root slog.Level) *Registry {
	r := &Registry{base: base, levels: map[string]*slog.LevelVar{}, set: map[string]bool{}}
	v := new(slog.LevelVar)
	v.Set(root)
	r.levels[RootName] = v
	r.set[RootName] = true
	return r
}

// Logger returns the logger called name (created on first use), tagged with a
// "logger" attribute.
func (r *Registry) Logger(name string) *slog.Logger {
	r.mu.Lock()
	if _, ok := r.levels[name]; !ok {
		r.levels[name] = new(slog.LevelVar)
	}
	r.mu.Unlock()
	return slog.New(&handler{reg: r, name: name, next: r.base}).With("logger", name)
}

// Effective is the level a logger obeys: its own if set, else the nearest
// dotted ancestor's, else the root's.
func (r *Registry) Effective(name string) slog.Level {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.effectiveLocked(name)
}

func (r *Registry) effectiveLocked(name string) slog.Level {
	for n := name; n != ""; {
		if r.set[n] {
			return r.levels[n].Level()
		}
		i := strings.LastIndexByte(n, '.')
		if i < 0 {
			break
		}
		n = n[:i]
	}
	return r.levels[RootName].Level()
}

// MaxLoggers bounds the loggers a Registry holds: Set refuses to create
// one past it (ErrTooManyLoggers), so GET /loglevel?logger_name=...&level=
// with ever new names cannot grow the process without bound. The binary's
// own loggers are a few dozen.
const MaxLoggers = 1024

// ErrTooManyLoggers is Set's error for a new logger past MaxLoggers.
var ErrTooManyLoggers = fmt.Errorf("more than %d loggers", MaxLoggers)

// MaxNameBytes bounds a logger name Set accepts. The name comes from a
// query string (up to the 128 KiB header limit) and is kept and logged,
// so without a bound MaxLoggers names could hold 128 MiB; dotted module
// paths, the names loggers have, are far shorter.
const MaxNameBytes = 256

// ErrNameTooLong is Set's error for a name longer than MaxNameBytes.
var ErrNameTooLong = fmt.Errorf("logger name longer than %d bytes", MaxNameBytes)

// Set gives name its own level (creating the logger if needed) and returns
// the parsed level.
func (r *Registry) Set(name, level string) (slog.Level, error) {
	l, err := ParseLevel(level)
	if err != nil {
		return 0, err
	}
	if len(name) > MaxNameBytes {
		return 0, ErrNameTooLong
	}
	r.mu.Lock()
	v, ok := r.levels[name]
	if !ok {
		if len(r.levels) >= MaxLoggers {
			r.mu.Unlock()
			return 0, ErrTooManyLoggers
		}
		v = new(slog.LevelVar)
		r.levels[name] = v
	}
	v.Set(l)
	r.set[name] = true
	r.mu.Unlock()
	return l, nil
}

// Entry is one logger and its effective level.
type Entry struct {
	Name  string
	Level slog.Level
}

// List returns every known logger with its effective level, sorted by name.
func (r *Registry) List() []Entry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Entry, 0, len(r.levels))
	for n := range r.levels {
		out = append(out, Entry{Name: n, Level: r.effectiveLocked(n)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

type handler struct {
	reg  *Registry
	name string
	next slog.Handler
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.reg.Effective(h.name) && h.next.Enabled(ctx, l)
}

func (h *handler) Handle(ctx context.Context, rec slog.Record) error {
	return h.next.Handle(ctx, rec)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{reg: h.reg, name: h.name, next: h.next.WithAttrs(as)}
}

func (h *handler) WithGroup(g string) slog.Handler {
	return &handler{reg: h.reg, name: h.name, next: h.next.WithGroup(g)}
}
