package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// sinkRec records KV events as "kind/medium:chunk,chunk".
type sinkRec struct {
	mu  sync.Mutex
	got []string
}

func (s *sinkRec) add(kind, medium string, keys []objkey.Key) {
	var cs []string
	for _, k := range keys {
		cs = append(cs, k.ChunkHash)
	}
	slices.Sort(cs)
	s.mu.Lock()
	s.got = append(s.got, fmt.Sprintf("%s/%s:%v", kind, medium, cs))
	s.mu.Unlock()
}

func (s *sinkRec) Stored(medium string, keys []objkey.Key)  { s.add("stored", medium, keys) }
func (s *sinkRec) Removed(medium string, keys []objkey.Key) { s.add("removed", medium, keys) }

func (s *sinkRec) events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// TestKVEventSink: a sink added with AddKVEventSink sees an L1 store as
// stored/CPU, its write-behind upload as stored/STORAGE, an L2 delete as
// removed/STORAGE, an L1 delete and a clear as removed/CPU.
func TestKVEventSink(t *testing.T) {
	a, err := openFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	e, err := New(Config{L1SizeBytes: 64 * objSize}, []l2.Adapter{a}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink := &sinkRec{}
	e.AddKVEventSink(sink)
	if err := e.RegisterLayout(Layout{ModelName: "m", WorldSize: 1, ObjectBytes: objSize}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{Engine: e, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- e.Run(ctx) }()
	defer h.stop(t)

	keys := flat(chunks("", 0, 3, 1))
	h.mustPut(t, keys)
	deadline := time.Now().Add(30 * time.Second)
	for h.Counters().L2[0].StoreObjects < 3 {
		if time.Now().After(deadline) {
			t.Fatal("uploads did not land")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := h.DeleteL2(context.Background(), 0, keys[:1]); err != nil {
		t.Fatal(err)
	}
	h.DeleteL1(keys[1:2], true)
	h.Clear()
	// Uploads may be reported in several calls: compare the union of the
	// STORAGE stores, the other events one by one.
	var storage []string
	var rest []string
	for _, ev := range sink.events() {
		if strings.HasPrefix(ev, "stored/STORAGE:") {
			storage = append(storage, strings.Fields(strings.Trim(strings.TrimPrefix(ev, "stored/STORAGE:"), "[]"))...)
			continue
		}
		rest = append(rest, ev)
	}
	slices.Sort(storage)
	if want := []string{"chunk-000000", "chunk-000001", "chunk-000002"}; !slices.Equal(storage, want) {
		t.Errorf("stored/STORAGE chunks %q, want %q", storage, want)
	}
	want := []string{
		"stored/CPU:[chunk-000000 chunk-000001 chunk-000002]",
		"removed/STORAGE:[chunk-000000]",
		"removed/CPU:[chunk-000001]",
		"removed/CPU:[chunk-000000 chunk-000002]",
	}
	if !slices.Equal(rest, want) {
		t.Fatalf("events\n%q\nwant\n%q", rest, want)
	}
}
