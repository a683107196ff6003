package mq_test

import (
	"bytes"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvevents"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestKVEventsLMCacheDrivenStore: lmcache-driven STOREs (the server copies
// from the worker's registered paged cache) publish BlockStored like
// engine-driven ones: a STORE of chunks 0-1 and a later STORE of chunk 2
// of the same prompt come back from POLL_KV_EVENTS as three stored CPU
// records with each chunk's tokens and the chain's parents (chunk 2's
// parent is chunk 1, from the earlier request), and none is unbound.
func TestKVEventsLMCacheDrivenStore(t *testing.T) {
	lg, err := kvevents.NewLog(16)
	if err != nil {
		t.Fatal(err)
	}
	rec := kvevents.NewRecorder(lg, nil, testChunk, nil)
	h := start(t, opts{mq: func(c *mq.Config) { c.KVEvents = rec }})
	h.eng.AddKVEventSink(rec)
	c := h.dial(mqclient.Options{})
	pc := newPagedCache(t)
	if b, err := c.Call(wire.OpRegisterKVCache, pc.registerFrames(t, 7)...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
	}
	toks := prompt(11, 3*testChunk)
	store := func(start, end int, reqID string, ids ...int) {
		t.Helper()
		k := wire.Marshal(key("m", 1, 0, toks, start, end, reqID))
		if b, err := c.Call(wire.OpStore, k, wire.EncodeInt(7), blockIDs(ids...), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferOK) {
			t.Fatalf("STORE [%d, %d) = %x %v", start, end, b, err)
		}
	}
	store(0, 2*testChunk, "r1", 5, 6, 1, 2)
	store(2*testChunk, 3*testChunk, "r2", 3, 4)

	hasher, _ := tokenhash.New(tokenhash.Blake3, testChunk)
	ids := make([]uint32, len(toks))
	for i, v := range toks {
		ids[i] = uint32(v)
	}
	hashes := hasher.ChunkHashesU32(ids)
	r := poll(t, h.worker(8, "m", 1, 0), "m", 0, 100)
	if !r.Enabled || r.Lost || len(r.Events) != 3 {
		t.Fatalf("poll: %+v", r)
	}
	checkStoredRecords(t, r.Events, toks, hashes)
	if rec.Unbound() != 0 {
		t.Errorf("%d lmcache-driven chunks stored unbound", rec.Unbound())
	}
}
