package coordinator_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// logRecord is one slog record as a test sees it: level, message and the
// attributes (the logger's own With attributes included), values rendered
// with fmt.Sprint so an int and an int64 compare alike.
type logRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// logRecords collects every record a server logs, at every level. Safe
// for concurrent use: the server's goroutines log while the test reads.
type logRecords struct {
	mu   sync.Mutex
	recs []logRecord
}

// withMsg returns the records whose message is msg, in logging order.
func (l *logRecords) withMsg(msg string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.recs {
		if r.Msg == msg {
			out = append(out, r)
		}
	}
	return out
}

type recordHandler struct {
	l     *logRecords
	attrs []slog.Attr
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = fmt.Sprint(a.Value.Resolve().Any())
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = fmt.Sprint(a.Value.Resolve().Any())
		return true
	})
	h.l.mu.Lock()
	h.l.recs = append(h.l.recs, rec)
	h.l.mu.Unlock()
	return nil
}

func (h recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordHandler{l: h.l, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

// WithGroup keeps the group's attributes flat: no coordinator log line
// names a key twice under different groups.
func (h recordHandler) WithGroup(string) slog.Handler { return h }

// startCoordRecorded is startCoord whose logger also hands every record to
// the returned collector (the text log in c.logs is kept as well).
func startCoordRecorded(t testing.TB, mutate func(*config.Config)) (*coord, *logRecords) {
	t.Helper()
	recs := &logRecords{}
	return startCoordLogging(t, mutate, recordHandler{l: recs}), recs
}
