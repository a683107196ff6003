package mq_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

func TestStoreLookupRetrieveTP1(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(101, "org/model-a", 1, 0)
	// The registration made the layout known to the engine (and so to
	// /cache/prefetches and the KV HTTP API).
	if l, err := h.eng.Layout("org/model-a", 1); err != nil || l.ObjectBytes != testObj {
		t.Fatalf("engine layout %+v %v", l, err)
	}
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(1, 5*testChunk+7) // 5 full chunks and a partial tail
	end := 5 * testChunk

	lk := key(w.model, 1, -1, tokens, 0, end, "req-1")
	if n := lookupOnce(t, sched, lk); n != 0 {
		t.Fatalf("lookup before store hit %d", n)
	}
	if n := w.store(tokens, 0, end, "req-1", data.of(1, 0)); n != 5 {
		t.Fatalf("PREPARE_STORE asked for %d chunks, want 5", n)
	}
	// Storing again: everything is cached, no slots, no commit needed.
	k := key(w.model, 1, 0, tokens, 0, end, "req-1")
	plan, err := w.c.PrepareStore(k, w.inst)
	if err != nil || plan.Refused || len(plan.Slots) != 0 {
		t.Fatalf("second PREPARE_STORE: %+v %v", plan, err)
	}

	lookupUntil(t, sched, key(w.model, 1, -1, tokens, 0, end, "req-2"), 5)
	if !w.retrieve(tokens, 0, end, "req-2", data.of(1, 0)) {
		t.Fatal("PREPARE_RETRIEVE failed after a full hit")
	}
	if err := sched.EndSession("req-2"); err != nil {
		t.Fatal(err)
	}

	// A prompt sharing the first 3 chunks hits exactly 3; the retrieve of a
	// sub-range [1, 3) works too.
	other := append(append([]wire.Int{}, tokens[:3*testChunk]...), prompt(2, 2*testChunk)...)
	lookupUntil(t, sched, key(w.model, 1, -1, other, 0, 5*testChunk, "req-3"), 3)
	if !w.retrieve(other, testChunk, 3*testChunk, "req-3", data.of(1, 0)) {
		t.Fatal("sub-range retrieve failed")
	}
	if err := sched.FreeLookupLocks(key(w.model, 1, -1, other, 0, testChunk, "req-3"), 1); err != nil {
		t.Fatal(err)
	}
	// Without a lookup the chunks are not read-locked: retrieve is refused.
	if w.retrieve(tokens, 0, end, "req-nolookup", data.of(1, 0)) {
		t.Fatal("PREPARE_RETRIEVE succeeded without a LOOKUP lock")
	}
	// Different salt and different world size never share objects.
	salted := key(w.model, 1, -1, tokens, 0, end, "req-4")
	salted.CacheSalt = "tenant-b"
	if n := lookupOnce(t, sched, salted); n != 0 {
		t.Fatalf("salted lookup hit %d", n)
	}
	if err := w.c.Unregister(w.inst); err != nil {
		t.Fatal(err)
	}
}

func TestStoreLookupRetrieveTP2(t *testing.T) {
	h := start(t, opts{})
	w0 := h.worker(200, "tp2-model", 2, 0)
	w1 := h.worker(201, "tp2-model", 2, 1)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(7, 4*testChunk)
	end := 4 * testChunk
	d0 := data.of(7, 0)
	d1 := data.of(7, 1)

	if n := w0.store(tokens, 0, end, "s", d0); n != 4 {
		t.Fatalf("rank 0 stored %d", n)
	}
	// Only rank 0 has the chunks: a lookup counts chunks present for every rank.
	if n := lookupOnce(t, sched, key("tp2-model", 2, -1, tokens, 0, end, "l0")); n != 0 {
		t.Fatalf("lookup with one rank stored hit %d, want 0", n)
	}
	// Rank 1 stores only the first 3 chunks: the common prefix is 3.
	if n := w1.store(tokens[:3*testChunk], 0, 3*testChunk, "s", d1); n != 3 {
		t.Fatalf("rank 1 stored %d", n)
	}
	lookupUntil(t, sched, key("tp2-model", 2, -1, tokens, 0, end, "l1"), 3)
	if err := sched.FreeLookupLocks(key("tp2-model", 2, -1, tokens, 0, 3*testChunk, "l1"), 2); err != nil {
		t.Fatal(err)
	}
	if n := w1.store(tokens, 0, end, "s", d1); n != 1 {
		t.Fatalf("rank 1 second store asked for %d chunks, want 1", n)
	}
	lookupUntil(t, sched, key("tp2-model", 2, -1, tokens, 0, end, "l2"), 4)
	// Each rank reads back its own bytes.
	if !w0.retrieve(tokens, 0, end, "l2", d0) || !w1.retrieve(tokens, 0, end, "l2", d1) {
		t.Fatal("TP=2 retrieve failed")
	}
}

// TestMLAObjectShape: MLA chunk objects drop the leading K/V axis, and a
// lookup takes num_kv_readers locks so every TP reader can retrieve.
func TestMLAObjectShape(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	p := regPayload(61, "mla-model", 1)
	p.UseMLA = true
	p.DtypeStr = "bfloat16"
	if _, err := c.Register(p); err != nil {
		t.Fatal(err)
	}
	tokens := prompt(61, 2*testChunk)
	k := key("mla-model", 1, 0, tokens, 0, 2*testChunk, "r")
	plan, err := c.PrepareStore(k, 61)
	if err != nil || len(plan.Slots) != 2 {
		t.Fatalf("PREPARE_STORE %+v %v", plan, err)
	}
	s := plan.Slots[0]
	if len(s.Shape) != 3 || s.Shape[0] != testLayers || s.Shape[1] != testChunk || s.Shape[2] != testHidden || s.Dtype != "bfloat16" || s.Length != testObj/2 {
		t.Fatalf("MLA slot %+v", s)
	}
	if ok, err := c.CommitStore(k, 61, nil); err != nil || !ok {
		t.Fatalf("COMMIT_STORE %v %v", ok, err)
	}
	// Two readers (MLA with TP=2 reading one object): both retrieves work.
	lk := key("mla-model", 1, -1, tokens, 0, 2*testChunk, "two-readers")
	lk.NumKVReaders = 2
	lookupUntil(t, c, lk, 2)
	rk := key("mla-model", 1, 0, tokens, 0, 2*testChunk, "two-readers")
	for reader := range 2 {
		ok, slots, err := c.PrepareRetrieve(rk, 61)
		if err != nil || !ok || len(slots) != 2 {
			t.Fatalf("reader %d PREPARE_RETRIEVE %v %d %v", reader, ok, len(slots), err)
		}
		if ok, err := c.CommitRetrieve(rk, 61); err != nil || !ok {
			t.Fatalf("reader %d COMMIT_RETRIEVE %v %v", reader, ok, err)
		}
	}
	// Both locks are gone now: a third retrieve is refused.
	if ok, _, err := c.PrepareRetrieve(rk, 61); err != nil || ok {
		t.Fatalf("third reader got ok=%v %v; the lookup took only 2 locks", ok, err)
	}
}

// fill writes a prompt's chunks into the slots of a PREPARE_STORE plan.
func (w *worker) fill(plan *mqclient.StorePlan, start int, data func(chunk int) []byte) {
	w.h.t.Helper()
	for i, s := range plan.Slots {
		mem, err := w.pool.Slot(s)
		if err != nil {
			w.h.t.Fatal(err)
		}
		copy(mem, data(start/testChunk+plan.ChunkIndices[i]))
	}
}

// TestInterleavedTransfersOfOneWorker: one worker prepares the same token
// range of two prompts before committing either (two new requests in one
// batch); each commit publishes its own prompt, and retrieves interleave
// the same way.
func TestInterleavedTransfersOfOneWorker(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	const end = 2 * testChunk
	seeds := []int{21, 22}
	var keys []*wire.Key
	var plans []*mqclient.StorePlan
	for _, seed := range seeds {
		k := key("m", 1, 0, prompt(seed, end), 0, end, fmt.Sprint("s", seed))
		plan, err := w.c.PrepareStore(k, w.inst)
		if err != nil || len(plan.Slots) != 2 {
			t.Fatalf("PREPARE_STORE of prompt %d: %+v %v", seed, plan, err)
		}
		keys, plans = append(keys, k), append(plans, plan)
	}
	for i, seed := range seeds {
		w.fill(plans[i], 0, data.of(seed, 0))
	}
	for i, k := range keys {
		if ok, err := w.c.CommitStore(k, w.inst, nil); err != nil || !ok {
			t.Fatalf("COMMIT_STORE of prompt %d = %v %v", seeds[i], ok, err)
		}
	}
	var slots [][]wire.Slot
	for _, seed := range seeds {
		rid := fmt.Sprint("r", seed)
		lookupUntil(t, sched, key("m", 1, -1, prompt(seed, end), 0, end, rid), 2)
		ok, s, err := w.c.PrepareRetrieve(key("m", 1, 0, prompt(seed, end), 0, end, rid), w.inst)
		if err != nil || !ok {
			t.Fatalf("PREPARE_RETRIEVE of prompt %d = %v %v", seed, ok, err)
		}
		slots = append(slots, s)
	}
	for i, seed := range seeds {
		for c, s := range slots[i] {
			mem, err := w.pool.Slot(s)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(mem, data.get(seed, 0, c)) {
				t.Fatalf("prompt %d chunk %d: retrieved bytes differ", seed, c)
			}
		}
		if ok, err := w.c.CommitRetrieve(key("m", 1, 0, prompt(seed, end), 0, end, fmt.Sprint("r", seed)), w.inst); err != nil || !ok {
			t.Fatalf("COMMIT_RETRIEVE of prompt %d = %v %v", seed, ok, err)
		}
	}
}

// TestProgressiveStore: a worker stores a request's chunks as they complete
// (start = stored so far), each request carrying the grown token list
// under the same request id, so the server extends the session's hashes
// instead of hashing from scratch. A lookup under a fresh request id,
// hashed from scratch, must find the same keys.
func TestProgressiveStore(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(51, 5*testChunk)
	for _, end := range []int{2, 3, 5} {
		start := map[int]int{2: 0, 3: 2, 5: 3}[end]
		if n := w.store(tokens[:end*testChunk], start*testChunk, end*testChunk, "grow", data.of(51, 0)); n != end-start {
			t.Fatalf("store [%d, %d) asked for %d chunks", start, end, n)
		}
	}
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 5*testChunk, "fresh"), 5)
	if !w.retrieve(tokens, 0, 5*testChunk, "fresh", data.of(51, 0)) {
		t.Fatal("retrieve of the progressively stored prompt failed")
	}
}
