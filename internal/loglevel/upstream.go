package loglevel

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ANSI sequences of upstream's CustomFormatter (lmcache/logging.py): the
// level colour opens the line, "\x1b[3m" (italic, which upstream calls
// underline) wraps the source. Upstream writes them whatever the output
// is, so pipelines that parse its lines already expect them.
const (
	ansiReset  = "\x1b[0m"
	ansiSource = "\x1b[3m"
)

// upstreamColors maps upstream's level names to CustomFormatter's colours.
var upstreamColors = map[string]string{
	"CRITICAL": "\x1b[31;1m",
	"ERROR":    "\x1b[31;20m",
	"WARNING":  "\x1b[33;20m",
	"INFO":     "\x1b[32;20m",
	"DEBUG":    "\x1b[1m",
}

// upstreamHandler writes upstream's line shape:
//
//	<colour>[2026-12-01 20:10:00,123] LMCache INFO:<reset> message k=v <italic>(file.go:42:lmcache.engine)<reset>
//
// asctime is Python's default ("%Y-%m-%d %H:%M:%S,mmm", local time), the
// source is the Go file's base name and line, and the name is the record's
// "logger" attribute (Registry adds it). slog attributes, which
// upstream's printf-style messages have no place for, follow the message
// as logfmt pairs. Lines are written whole under one mutex shared by the
// handler's clones, so concurrent records never interleave.
type upstreamHandler struct {
	mu     *sync.Mutex
	w      io.Writer
	loc    *time.Location
	name   string
	attrs  string // preformatted " k=v" pairs from WithAttrs
	prefix string // group path, "g1.g2." from WithGroup
}

func newUpstreamHandler(w io.Writer, loc *time.Location) *upstreamHandler {
	return &upstreamHandler{mu: new(sync.Mutex), w: w, loc: loc, name: RootName}
}

// Enabled lets every record through: levels are the Registry's job.
func (h *upstreamHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *upstreamHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	name := Name(r.Level)
	b.WriteString(upstreamColors[name])
	b.WriteByte('[')
	t := r.Time
	if t.IsZero() {
		t = time.Now()
	}
	t = t.In(h.loc)
	b.WriteString(t.Format("2006-01-02 15:04:05"))
	fmt.Fprintf(&b, ",%03d] LMCache %s:", t.Nanosecond()/1e6, name)
	b.WriteString(ansiReset)
	b.WriteByte(' ')
	b.WriteString(r.Message)
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		appendAttr(&b, h.prefix, a)
		return true
	})
	file, line := "unknown", 0
	if r.PC != 0 {
		f, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
		file, line = filepath.Base(f.File), f.Line
	}
	fmt.Fprintf(&b, " %s(%s:%d:%s)%s\n", ansiSource, file, line, h.name, ansiReset)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *upstreamHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range as {
		// The logger name is upstream's %(name)s, not a pair.
		if a.Key == "logger" && h.prefix == "" {
			c.name = a.Value.String()
			continue
		}
		appendAttr(&b, h.prefix, a)
	}
	c.attrs = b.String()
	return &c
}

func (h *upstreamHandler) WithGroup(g string) slog.Handler {
	if g == "" {
		return h
	}
	c := *h
	c.prefix = h.prefix + g + "."
	return &c
}

// appendAttr writes " key=value", quoting values that would not survive a
// whitespace split, and flattening groups into dotted keys.
func appendAttr(b *strings.Builder, prefix string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			appendAttr(b, p, g)
		}
		return
	}
	b.WriteByte(' ')
	b.WriteString(prefix + a.Key)
	b.WriteByte('=')
	s := a.Value.String()
	if s == "" || strings.ContainsAny(s, " \t\n\r\"=") || !strconv.CanBackquote(s) {
		s = strconv.Quote(s)
	}
	b.WriteString(s)
}
