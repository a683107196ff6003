package mq

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func ids(groups ...[]int64) []byte {
	b := msgp.AppendArrayHeader(nil, uint32(len(groups)))
	for _, g := range groups {
		b = msgp.AppendArrayHeader(b, uint32(len(g)))
		for _, v := range g {
			b = msgp.AppendInt64(b, v)
		}
	}
	return b
}

// TestDecodeBlockIDs: gpu_block_ids as one list per group (newer clients)
// or one flat list (older ones); a second non-empty group is a hybrid
// model and refused; oversized or malformed lists are errors.
func TestDecodeBlockIDs(t *testing.T) {
	flat := msgp.AppendArrayHeader(nil, 3)
	for _, v := range []int64{4, 5, 6} {
		flat = msgp.AppendInt64(flat, v)
	}
	for name, tc := range map[string]struct {
		in   []byte
		want []int64
	}{
		"one group":          {ids([]int64{7, 8, 9}), []int64{7, 8, 9}},
		"flat":               {flat, []int64{4, 5, 6}},
		"empty":              {msgp.AppendArrayHeader(nil, 0), nil},
		"second group empty": {ids([]int64{1}, nil), []int64{1}},
	} {
		got, err := decodeBlockIDs(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, %v; want %v", name, got, err, tc.want)
		}
	}
	if _, err := decodeBlockIDs(ids([]int64{1}, []int64{2})); !errors.Is(err, kvlayout.ErrHybrid) {
		t.Errorf("two non-empty groups: %v, want ErrHybrid", err)
	}
	huge := msgp.AppendArrayHeader(msgp.AppendArrayHeader(nil, 1), maxBlockIDs+1)
	for name, in := range map[string][]byte{"too many ids": huge, "not a list": msgp.AppendInt(nil, 3),
		"string id": msgp.AppendString(msgp.AppendArrayHeader(nil, 1), "x"), "truncated": ids([]int64{1, 2})[:3]} {
		if _, err := decodeBlockIDs(in); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// TestDecodeLayoutHints: the TypedDict's known keys are read, others and
// nil ignored, a non-map refused.
func TestDecodeLayoutHints(t *testing.T) {
	m := msgp.AppendMapHeader(nil, 4)
	m = msgp.AppendString(msgp.AppendString(m, "kv_layout"), "HND")
	m = msgp.AppendInt(msgp.AppendString(m, "tokens_per_block"), 16)
	m = msgp.AppendInt(msgp.AppendString(m, "num_kv_heads"), 8)
	m = msgp.AppendInt(msgp.AppendString(m, "head_dim"), 128)
	h, err := decodeLayoutHints(m)
	if err != nil || h != (kvlayout.Hints{KVLayout: "HND", TokensPerBlock: 16, NumKVHeads: 8}) {
		t.Fatalf("got %+v, %v", h, err)
	}
	if h, err := decodeLayoutHints(msgp.AppendNil(nil)); err != nil || h != (kvlayout.Hints{}) {
		t.Fatalf("nil hints: %+v, %v", h, err)
	}
	if _, err := decodeLayoutHints(msgp.AppendInt(nil, 1)); err == nil {
		t.Fatal("an int accepted as layout_hints")
	}
}

// FuzzLMDFrames: REGISTER_KV_CACHE's kv_caches and layout_hints frames
// and STORE's gpu_block_ids never panic the decoders, whatever they hold.
//
//	go test -run '^$' -fuzz FuzzLMDFrames -fuzztime 30s ./internal/mq/
func FuzzLMDFrames(f *testing.F) {
	f.Add(ids([]int64{1, 2}), msgp.AppendMapHeader(nil, 0))
	f.Add(msgp.AppendArrayHeader(nil, 1), msgp.AppendNil(nil))
	ext, _ := msgp.AppendExtension(msgp.AppendArrayHeader(nil, 1), &msgp.RawExtension{Type: 1, Data: []byte{0x80, 4, 'N', '.'}})
	f.Add(ext, msgp.AppendString(nil, "x"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		frames := [][]byte{msgp.AppendInt(nil, 1), a, msgp.AppendString(nil, "m"), msgp.AppendInt(nil, 1), msgp.AppendNil(nil), b, a}
		if d, err := decodeLMDRegister(frames); err == nil && (len(d.wrappers) == 0 || len(d.wrappers) > maxLMDLayers) {
			t.Fatalf("decoded %d wrappers", len(d.wrappers))
		}
		if got, err := decodeBlockIDs(a); err == nil && len(got) > maxBlockIDs {
			t.Fatalf("decoded %d block ids", len(got))
		}
		_, _ = decodeLayoutHints(b)
	})
}

// TestAwaitCommitsNeverBlocksInline: a LOOKUP answered on the socket
// goroutine (mayWait false) whose chunks a CUDA store covers that became
// pending after the hand-off check does not wait for it: it returns at
// once and counts outcome="not_waited". (The wait itself, on a handed-off
// LOOKUP, is TestLMDCUDALookupWaitsForCommit's.)
func TestAwaitCommitsNeverBlocksInline(t *testing.T) {
	s := &Server{cfg: Config{ChunkSize: 256}, log: slog.New(slog.DiscardHandler), metrics: mpmetrics.New("", nil), handlerCtx: context.Background()}
	st := newState(s)
	keys := []objkey.Key{{ModelName: "m", ChunkHash: "\x00"}}
	ps := st.lmd.commits.add(keys)
	defer st.lmd.commits.finish(ps, keys)
	st.lmd.commits.onWait = func(op string) { t.Errorf("%s waited on the socket goroutine", op) }
	st.lmdAwaitCommits("lookup", keys, false)
	var m dto.Metric
	if err := s.metrics.TransferCommitWaits.WithLabelValues("lookup", "not_waited").Write(&m); err != nil || m.Counter.GetValue() != 1 {
		t.Fatalf("not_waited counted %v (%v), want 1", m.Counter.GetValue(), err)
	}
}
