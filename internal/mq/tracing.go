package mq

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/tracing"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// tracedOp reports whether op gets a request span: the lookup and the
// engine-driven store and retrieve steps (issue 14), not the cheap polls.
func tracedOp(op wire.Op) bool {
	switch op {
	case wire.OpLookup, wire.OpPrepareStore, wire.OpCommitStore, wire.OpPrepareRetrieve, wire.OpCommitRetrieve:
		return true
	}
	return false
}

// traceStart opens req's span, named by the operation (LOOKUP,
// PREPARE_STORE, ...); a no-op span when tracing is off or op is untraced.
func (st *state) traceStart(ctx context.Context, req *request) (context.Context, trace.Span) {
	if !tracedOp(req.op) {
		return ctx, trace.SpanFromContext(context.Background())
	}
	ctx, span := tracing.Request(ctx, req.op.EnumName())
	req.span = span.SpanContext()
	return ctx, span
}

// contextCommitter is the engine's COMMIT_STORE that takes the request's
// span as the parent of the write-behind uploads' spans (*engine.Engine has
// it; a wrapper that only implements Engine commits untraced).
type contextCommitter interface {
	CommitWriteContext(ctx context.Context, tag string, keys []objkey.Key) (int, error)
}

// commitWrite publishes a COMMIT_STORE's staged keys; when the request is
// traced, its uploads to L2 join its trace.
func (st *state) commitWrite(req *request, tag string, keys []objkey.Key) (int, error) {
	if cc, ok := st.s.eng.(contextCommitter); ok && req.span.IsValid() {
		return cc.CommitWriteContext(trace.ContextWithSpanContext(context.Background(), req.span), tag, keys)
	}
	return st.s.eng.CommitWrite(tag, keys)
}

// traceEnd annotates and ends req's span. The key is decoded again only
// when the span records, so the data path pays nothing with tracing off;
// token ids never leave as attributes, only their count.
func (st *state) traceEnd(span trace.Span, req *request, err error) {
	if !span.IsRecording() {
		return
	}
	if key, kerr := req.decodeKey(); kerr == nil {
		span.SetAttributes(tracing.KeyModel.String(key.ModelName), tracing.KeyTokens.Int(len(key.TokenIDs)),
			tracing.KeyWorldSize.Int64(int64(key.WorldSize)))
		if first, last, cerr := st.chunkRange(key); cerr == nil {
			span.SetAttributes(tracing.KeyChunks.Int(last - first))
		}
	}
	tracing.End(span, err)
}
