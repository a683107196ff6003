package mq_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

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
	d := func(c int) []byte { return data.get(11, 0, c) }
	w.store(tokens, 0, 3*testChunk, "s", d)

	deadline := time.Now().Add(10 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "*.data"))
		if len(files) == 3 {
			break
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(dir)
			t.Fatalf("write-behind produced %d objects: %v", len(files), entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
