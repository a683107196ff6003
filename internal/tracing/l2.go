package tracing

import (
	"context"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Adapter wraps an L2 adapter so Store, LookupAndLock, Load and Delete are
// storage-level spans ("l2.store", "l2.lookup", "l2.load", "l2.delete")
// naming the adapter type and counting keys, hits and bytes. The engine sees
// the same contract; everything else passes through.
func Adapter(a l2.Adapter) l2.Adapter { return &tracedAdapter{Adapter: a} }

type tracedAdapter struct{ l2.Adapter }

func (t *tracedAdapter) Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error {
	ctx, span := Storage(ctx, "l2.store")
	if span.IsRecording() {
		var n int64
		for _, o := range objs {
			n += int64(len(o))
		}
		span.SetAttributes(KeyAdapter.String(t.TypeName()), KeyKeys.Int(len(keys)), KeyBytes.Int64(n))
	}
	err := t.Adapter.Store(ctx, keys, objs)
	End(span, err)
	return err
}

func (t *tracedAdapter) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	ctx, span := Storage(ctx, "l2.lookup")
	hits, err := t.Adapter.LookupAndLock(ctx, keys)
	if span.IsRecording() {
		span.SetAttributes(KeyAdapter.String(t.TypeName()), KeyKeys.Int(len(keys)), KeyHitKeys.Int(countTrue(hits)))
	}
	End(span, err)
	return hits, err
}

func (t *tracedAdapter) Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error) {
	ctx, span := Storage(ctx, "l2.load")
	ok, err := t.Adapter.Load(ctx, keys, dst)
	if span.IsRecording() {
		var n int64
		for i, b := range dst {
			if i < len(ok) && ok[i] {
				n += int64(len(b))
			}
		}
		span.SetAttributes(KeyAdapter.String(t.TypeName()), KeyKeys.Int(len(keys)), KeyHitKeys.Int(countTrue(ok)), KeyBytes.Int64(n))
	}
	End(span, err)
	return ok, err
}

func (t *tracedAdapter) Delete(ctx context.Context, keys []objkey.Key) ([]objkey.Key, error) {
	ctx, span := Storage(ctx, "l2.delete")
	gone, err := t.Adapter.Delete(ctx, keys)
	if span.IsRecording() {
		span.SetAttributes(KeyAdapter.String(t.TypeName()), KeyKeys.Int(len(keys)), KeyHitKeys.Int(len(gone)))
	}
	End(span, err)
	return gone, err
}

func countTrue(b []bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}
