package mq

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"unicode/utf8"
)

// maxLogValue bounds each string, error or Stringer value a data-path log
// line carries, and maxLogMessage its message. Peers put what they like in
// op frames, model names, salts, dtype strings and request ids, and
// several lines quote them (an undecodable op frame in hex, an unknown op
// name, decode and validation errors): without a bound one message of a
// few MiB becomes a log line twice its size, once per peer and interval.
// Values of the server's own making stay well under both.
const (
	maxLogValue   = 512
	maxLogMessage = 4096
)

// clipHandler is the data path's log handler: inner, with every record's
// message and attribute values cut to the bounds above. It clips only
// records that are written, so suppressed and disabled lines cost nothing.
type clipHandler struct{ slog.Handler }

// Handle writes r with its message and values clipped.
func (h clipHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, clipString(r.Message, maxLogMessage), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(clipAttr(a))
		return true
	})
	return h.Handler.Handle(ctx, out)
}

// WithAttrs clips attrs too and keeps the result clipping.
func (h clipHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = clipAttr(a)
	}
	return clipHandler{h.Handler.WithAttrs(out)}
}

// WithGroup keeps the result clipping.
func (h clipHandler) WithGroup(name string) slog.Handler {
	return clipHandler{h.Handler.WithGroup(name)}
}

// clipAttr cuts a's value to maxLogValue bytes when it is text (a string,
// an error or a Stringer, which a handler would print whole), inside
// groups too; other values are left as they are.
func clipAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	var s string
	switch v.Kind() {
	case slog.KindString:
		s = v.String()
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i := range g {
			out[i] = clipAttr(g[i])
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			s = x.Error()
		case fmt.Stringer:
			s = x.String()
		}
	}
	if len(s) > maxLogValue {
		return slog.String(a.Key, clipString(s, maxLogValue))
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// clipString is s when it is at most max bytes long, else its first max
// bytes (back to a rune boundary) and the length it had.
func clipString(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "...[" + strconv.Itoa(len(s)) + " bytes]"
}
