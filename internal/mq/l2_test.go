package mq_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/mqclient"
)

// TestLookupLoadsL2HitsIntoL1: chunks written behind to an L2 (the fs
// adapter on a real directory) and dropped from L1 are found by LOOKUP,
// loaded back into L1 and retrieved byte-identical over shared memory.
func TestLookupLoadsL2HitsIntoL1(t *testing.T) {
	dir := t.TempDir()
	adapter, err := fs.New(fs.Config{BasePath: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adapter.Close() })
	h := start(t, opts{l2: []l2.Adapter{adapter}})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(11, 3*testChunk)
	d := data.of(11, 0)
	w.store(tokens, 0, 3*testChunk, "s", d)

	waitFiles(t, dir, 3)
	// Drop L1 (CLEAR) and wait until nothing is resident any more.
	if err := sched.Clear(true); err != nil {
		t.Fatal(err)
	}
	if got := len(h.eng.Layouts()); got != 1 {
		t.Fatalf("engine knows %d layouts, want the registered one", got)
	}
	before := h.eng.Counters().PrefetchHitChunksL2
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 3*testChunk, "after-clear"), 3)
	if got := h.eng.Counters().PrefetchHitChunksL2 - before; got < 3 {
		t.Fatalf("%d chunks came from L2, want 3 (CLEAR left them in L1?)", got)
	}
	if !w.retrieve(tokens, 0, 3*testChunk, "after-clear", d) {
		t.Fatal("retrieve of chunks loaded from L2 failed")
	}
}

// waitFiles waits until dir holds n objects written behind.
func waitFiles(t *testing.T, dir string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "*.data"))
		if len(files) == n {
			return
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(dir)
			t.Fatalf("write-behind produced %d objects, want %d: %v", len(files), n, entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLookupWithRegisterModelBeforeAnyWorker: a server restarted over a
// populated L2 with the model's layout given by --register-model answers
// LOOKUP from L2 before any vLLM worker has registered a context, and the
// worker that registers afterwards retrieves the bytes.
func TestLookupWithRegisterModelBeforeAnyWorker(t *testing.T) {
	dir := t.TempDir()
	newFS := func() l2.Adapter {
		a, err := fs.New(fs.Config{BasePath: dir, RecoverOnStart: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	data := chunkData{}
	tokens := prompt(12, 3*testChunk)
	d := data.of(12, 0)

	// The first server's worker fills L2.
	first := start(t, opts{l2: []l2.Adapter{newFS()}})
	first.worker(1, "m", 1, 0).store(tokens, 0, 3*testChunk, "s", d)
	waitFiles(t, dir, 3)

	// The second server knows the layout only from --register-model.
	h := start(t, opts{l2: []l2.Adapter{newFS()}})
	sched := h.dial(mqclient.Options{})
	if n := lookupOnce(t, sched, key("m", 1, -1, tokens, 0, 3*testChunk, "no-layout")); n != 0 {
		t.Fatalf("lookup without any layout hit %d chunks", n)
	}
	layout, err := httpapi.ParseRegisterModel(`{"model_name":"m","world_size":1,"num_layers":2,"hidden_size":64,"dtype":"float16"}`, testChunk)
	if err != nil {
		t.Fatal(err)
	}
	if layout.ObjectBytes != testObj {
		t.Fatalf("--register-model object size %d, a worker's is %d", layout.ObjectBytes, testObj)
	}
	if err := h.eng.RegisterLayout(layout); err != nil {
		t.Fatal(err)
	}
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 3*testChunk, "r"), 3)
	w := h.worker(2, "m", 1, 0)
	if !w.retrieve(tokens, 0, 3*testChunk, "r", d) {
		t.Fatal("retrieve of chunks found through the --register-model layout failed")
	}
}
