package kvevents

import (
	"context"
	"reflect"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/polltest"
)

// TestRebindRefreshesBinding: binding a chunk again makes it the newest
// binding (upstream's move_to_end), so the trim that follows keeps it and
// its store is published with the tokens of the latest bind.
func TestRebindRefreshesBinding(t *testing.T) {
	lg, _ := NewLog(8)
	var d drops
	r := NewRecorder(lg, nil, 1, d.add)
	h := wideHash
	for i := range bindingCacheSize {
		r.Bind(nil, [][]byte{h(i)}, [][]uint32{{uint32(i)}})
	}
	r.Bind(nil, [][]byte{h(0)}, [][]uint32{{7}}) // chunk 0 again: now the newest
	r.Bind(nil, [][]byte{h(bindingCacheSize)}, [][]uint32{{1}})
	r.Stored(MediumCPU, []objkey.Key{{ChunkHash: string(h(0)), ModelName: "m"}, {ChunkHash: string(h(1)), ModelName: "m"}})
	recs, _, _, _ := lg.ReadAfter(0, "m", 10)
	want := []Record{{Seq: 1, Kind: KindStored, Medium: MediumCPU, Model: "m", Hashes: [][]byte{h(0)}, Tokens: []uint32{7}, BlockSize: 1}}
	if !reflect.DeepEqual(recs, want) || r.Unbound() != 1 || d.get(DropUnbound) != 1 {
		t.Fatalf("records %+v unbound %d drops %v; want chunk 0 (re-bound last) kept with tokens [7], chunk 1 (oldest) trimmed", recs, r.Unbound(), d.n)
	}
}

// TestEventsAfterStopCounted: batches queued while the publisher never
// ran are counted as publish_failed when Close releases it, and so are
// batches published after it stopped: none is lost uncounted.
func TestEventsAfterStopCounted(t *testing.T) {
	var d drops
	r, err := New(Config{Loops: periodic.NewRegistry(), Dropped: d.add, Publisher: PublisherConfig{Endpoint: "inproc://kv-stop-count"}})
	if err != nil {
		t.Fatal(err)
	}
	r.Removed(MediumCPU, []objkey.Key{key(1, "m", 0, ""), key(2, "n", 0, "")}) // queued, never sent
	r.Close()
	if got := d.get(DropPublishFailed); got != 2 {
		t.Fatalf("after Close publish_failed %d, want the 2 queued events", got)
	}
	r.Removed(MediumCPU, []objkey.Key{key(3, "m", 0, "")})
	if got, full := d.get(DropPublishFailed), d.get(DropQueueFull); got != 3 || full != 0 {
		t.Fatalf("publish_failed %d queue_full %d after a removal past Close, want 3, 0", got, full)
	}
}

// TestPublisherDrainsQueueOnStop: batches still queued when Run's context
// is cancelled are sent before the sockets close (vLLM's publisher thread
// drains its queue on shutdown); a SUB receives them in sequence order,
// and a batch published after Run returned is refused.
func TestPublisherDrainsQueueOnStop(t *testing.T) {
	var d drops
	r, err := New(Config{Loops: periodic.NewRegistry(), Dropped: d.add, Publisher: PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: "kv"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := r.Publisher()
	sub := dial(t, zmq.SUB, p.Endpoint(), func(s *zmq.Socket) error { return s.SetSubscribe("kv") })
	_ = sub.SetRcvtimeo(20 * time.Millisecond)
	// Run has not started, so this goroutine owns the sockets: probe
	// until the subscription has arrived (the slow-joiner problem).
	polltest.Until(t, 10*time.Second, "a probe to reach the SUB", func() bool {
		p.send([]Record{removed("m", 9)})
		_, err := sub.RecvMessageBytes(0)
		return err == nil
	})
	probes := p.seq
	for i := 1; i <= 3; i++ {
		if !p.Publish([]Record{removed("m", i)}) {
			t.Fatal("Publish refused with room in the queue")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Run(ctx) // stopped from the start: only the drain sends
	_ = sub.SetRcvtimeo(10 * time.Second)
	got := recvRemovals(t, sub, 3) // a receive error: the queued batches were not sent
	if want := []uint64{probes, probes + 1, probes + 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("drained sequences %v, want %v", got, want)
	}
	if p.Publish([]Record{removed("m", 4)}) {
		t.Error("Publish accepted a batch after Run returned")
	}
	if n := d.get(DropPublishFailed); n != 0 {
		t.Errorf("publish_failed %d, want 0 (Publish's caller counts its refusal)", n)
	}
}
