package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/tinylib/msgp/msgp"
	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func hash(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 32) }

// wideHash is a distinct 32-byte chunk hash for every i, for tests that
// need more chunks than hash's 256.
func wideHash(i int) []byte {
	b := make([]byte, 32)
	binary.BigEndian.PutUint64(b, uint64(i))
	return b
}

func key(i int, model string, rank int64, salt string) objkey.Key {
	return objkey.Key{ChunkHash: string(hash(i)), ModelName: model, KVRank: rank, CacheSalt: salt}
}

func removed(model string, hs ...int) Record {
	r := Record{Kind: KindRemoved, Medium: MediumCPU, Model: model}
	for _, h := range hs {
		r.Hashes = append(r.Hashes, hash(h))
	}
	return r
}

func seqs(rs []Record) []int64 {
	out := []int64{}
	for _, r := range rs {
		out = append(out, r.Seq)
	}
	return out
}

// TestLogReadAfter: records are numbered from 1; a poll returns the
// records of its model after the cursor, pages by max, advances past other
// models, and reports lost when the cursor fell out of the window (an
// overflow) or was never issued (a restarted server).
func TestLogReadAfter(t *testing.T) {
	lg, err := NewLog(3)
	if err != nil {
		t.Fatal(err)
	}
	check := func(cursor int64, max int, wantSeqs []int64, wantNext int64, wantLost bool) {
		t.Helper()
		recs, next, lost, err := lg.ReadAfter(cursor, "m", max)
		if err != nil || !reflect.DeepEqual(seqs(recs), wantSeqs) || next != wantNext || lost != wantLost {
			t.Fatalf("ReadAfter(%d, %d) = %v next %d lost %v err %v; want %v next %d lost %v", cursor, max, seqs(recs), next, lost, err, wantSeqs, wantNext, wantLost)
		}
	}
	check(0, 5, []int64{}, 0, false)
	check(4, 5, []int64{}, 0, true)
	for _, m := range []string{"m", "other", "m"} {
		lg.Append(removed(m, 1))
	}
	check(0, 5, []int64{1, 3}, 3, false)
	check(0, 1, []int64{1}, 1, false)
	check(1, 5, []int64{3}, 3, false)
	check(3, 5, []int64{}, 3, false)
	check(9, 5, []int64{}, 3, true)
	if _, discarded := lg.Append(removed("m", 2)); !discarded {
		t.Fatal("the fourth record in a log of 3 discarded nothing")
	}
	check(0, 5, []int64{3, 4}, 4, true)
	check(1, 5, []int64{3, 4}, 4, false)
	if lg.Len() != 3 || lg.NextSeq() != 5 || lg.Capacity() != 3 || lg.Incarnation() <= 0 {
		t.Errorf("len %d next %d cap %d incarnation %d", lg.Len(), lg.NextSeq(), lg.Capacity(), lg.Incarnation())
	}
	for _, bad := range [][2]int64{{-1, 1}, {0, 0}} {
		if _, _, _, err := lg.ReadAfter(bad[0], "m", int(bad[1])); err == nil {
			t.Errorf("ReadAfter(%d, %d) accepted", bad[0], bad[1])
		}
	}
	if _, err := NewLog(0); err == nil {
		t.Error("NewLog(0) accepted")
	}
}

type drops struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *drops) add(reason string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[reason] += n
}

// TestRecorderRecords: a bound chunk stored on two ranks is one stored
// record with its tokens and parent; an unbound one and a salted one are
// dropped and counted; a removal is one record per model with each chunk
// once.
func TestRecorderRecords(t *testing.T) {
	lg, _ := NewLog(64)
	var d drops
	r := NewRecorder(lg, nil, 4, d.add)
	r.Bind(nil, [][]byte{hash(1), hash(2)}, [][]uint32{{10, 11, 12, 13}, {20, 21, 22, 23}})
	r.Bind(hash(2), [][]byte{hash(3)}, [][]uint32{{30, 31, 32, 33}})
	r.Stored(MediumCPU, []objkey.Key{key(1, "m", 0, ""), key(1, "m", 1, ""), key(2, "m", 0, ""), key(3, "m", 0, ""), key(9, "m", 0, ""), key(1, "m", 0, "tenant")})
	r.Removed(MediumStorage, []objkey.Key{key(1, "m", 0, ""), key(1, "m", 1, ""), key(2, "m", 0, ""), key(5, "n", 0, "")})
	recs, next, lost, err := lg.ReadAfter(0, "m", 100)
	if err != nil || next != 5 || lost {
		t.Fatalf("next %d lost %v err %v", next, lost, err)
	}
	want := []Record{
		{Seq: 1, Kind: KindStored, Medium: MediumCPU, Model: "m", Hashes: [][]byte{hash(1)}, Tokens: []uint32{10, 11, 12, 13}, BlockSize: 4},
		{Seq: 2, Kind: KindStored, Medium: MediumCPU, Model: "m", Hashes: [][]byte{hash(2)}, Parent: hash(1), Tokens: []uint32{20, 21, 22, 23}, BlockSize: 4},
		{Seq: 3, Kind: KindStored, Medium: MediumCPU, Model: "m", Hashes: [][]byte{hash(3)}, Parent: hash(2), Tokens: []uint32{30, 31, 32, 33}, BlockSize: 4},
		{Seq: 4, Kind: KindRemoved, Medium: MediumStorage, Model: "m", Hashes: [][]byte{hash(1), hash(2)}, BlockSize: 4},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("records\n%+v\nwant\n%+v", recs, want)
	}
	other, _, _, _ := lg.ReadAfter(0, "n", 100)
	if len(other) != 1 || other[0].Seq != 5 || !bytes.Equal(other[0].Hashes[0], hash(5)) {
		t.Errorf("model n: %+v", other)
	}
	if r.Unbound() != 1 || d.n[DropUnbound] != 1 || d.n[DropSalted] != 1 {
		t.Errorf("unbound %d, drops %v", r.Unbound(), d.n)
	}
}

// TestBindingCacheIsBounded: past bindingCacheSize the oldest half of the
// bindings goes; the newest stay usable.
func TestBindingCacheIsBounded(t *testing.T) {
	lg, _ := NewLog(8)
	r := NewRecorder(lg, nil, 1, nil)
	h := wideHash
	for i := range bindingCacheSize + 1 {
		r.Bind(nil, [][]byte{h(i)}, [][]uint32{{uint32(i)}})
	}
	if len(r.binds) != bindingCacheSize/2 || r.order.Len() != bindingCacheSize/2 {
		t.Fatalf("%d bindings, %d in order; want %d", len(r.binds), r.order.Len(), bindingCacheSize/2)
	}
	r.Stored(MediumCPU, []objkey.Key{{ChunkHash: string(h(0)), ModelName: "m"}, {ChunkHash: string(h(bindingCacheSize)), ModelName: "m"}})
	recs, _, _, _ := lg.ReadAfter(0, "m", 10)
	if len(recs) != 1 || recs[0].Tokens[0] != uint32(bindingCacheSize) || r.Unbound() != 1 {
		t.Errorf("records %+v unbound %d; want only the newest chunk", recs, r.Unbound())
	}
}

// TestExternalHash: the low 64 bits of the big-endian chunk hash, as
// vLLM's int.from_bytes(h, "big") & (2**64 - 1).
func TestExternalHash(t *testing.T) {
	h := make([]byte, 32)
	for i := range h {
		h[i] = byte(i)
	}
	if got := ExternalHash(h); got != 0x18191a1b1c1d1e1f {
		t.Errorf("ExternalHash = %#x, want 0x18191a1b1c1d1e1f", got)
	}
	if got := ExternalHash([]byte{1, 2}); got != 0x0102 {
		t.Errorf("short hash = %#x", got)
	}
}

// decode turns msgpack into plain Go values (maps, slices, ints, strings).
func decode(t *testing.T, b []byte) any {
	t.Helper()
	v, rest, err := msgp.ReadIntfBytes(b)
	if err != nil || len(rest) != 0 {
		t.Fatalf("decode: %v, %d trailing", err, len(rest))
	}
	return v
}

// TestBatchShape: the batch is vLLM 0181ea31's msgspec encoding: a map
// batch of "type"-tagged map events, hashes as 64-bit ints.
func TestBatchShape(t *testing.T) {
	ts := time.Unix(1700000000, 500000000)
	b := AppendBatch(nil, ts, 2, []Record{
		{Kind: KindStored, Medium: MediumCPU, Hashes: [][]byte{hash(1)}, Parent: hash(2), Tokens: []uint32{7, 8}, BlockSize: 2},
		{Kind: KindRemoved, Medium: MediumStorage, Hashes: [][]byte{hash(1), hash(3)}},
	})
	got := decode(t, b)
	want := map[string]any{
		"ts": 1700000000.5,
		"events": []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(0x0101010101010101)}, "parent_block_hash": uint64(0x0202020202020202),
				"token_ids": []any{uint64(7), uint64(8)}, "block_size": int64(2), "lora_id": nil, "medium": "CPU", "lora_name": nil},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(0x0101010101010101), uint64(0x0303030303030303)}, "medium": "STORAGE"},
		},
		"data_parallel_rank": int64(2),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batch\n%v\nwant\n%v", got, want)
	}
}

// TestPollResultShape: the POLL_KV_EVENTS reply map, hashes raw bytes.
func TestPollResultShape(t *testing.T) {
	b := AppendPollResult(nil, true, 42, 7, true, []Record{{Seq: 7, Kind: KindStored, Medium: MediumCPU, Model: "m", Hashes: [][]byte{{1, 2}}, Tokens: []uint32{5}, BlockSize: 1}})
	got := fmt.Sprint(decode(t, b))
	want := fmt.Sprint(map[string]any{"enabled": true, "incarnation": int64(42), "next_cursor": int64(7), "lost": true, "events": []any{
		map[string]any{"seq": int64(7), "kind": "stored", "medium": "CPU", "model_name": "m", "block_hashes": []any{[]byte{1, 2}},
			"parent_block_hash": nil, "token_ids": []any{uint64(5)}, "block_size": int64(1)}}})
	if got != want {
		t.Fatalf("poll result\n%s\nwant\n%s", got, want)
	}
}

// dial connects a socket of kind to endpoint (set, if any, runs first);
// receives time out after 10 s so a broken publisher fails the test.
func dial(t *testing.T, kind zmq.Type, endpoint string, set func(*zmq.Socket) error) *zmq.Socket {
	t.Helper()
	s, err := zmq.NewSocket(kind)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	_ = s.SetLinger(0)
	_ = s.SetRcvtimeo(10 * time.Second)
	if set != nil {
		if err := set(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPublisherSubscribeAndReplay: a real ZMQ SUB receives (topic, seq,
// payload) with sequences from 0, and a DEALER asking the replay socket
// for sequence 1 gets batches 1 and 2 then the end marker.
func TestPublisherSubscribeAndReplay(t *testing.T) {
	loops := periodic.NewRegistry()
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv"}, loops, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := loops.Get("kv_events_publisher"); !ok {
		t.Error("the publisher loop is not in the periodic registry")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	sub := dial(t, zmq.SUB, p.Endpoint(), func(s *zmq.Socket) error { return s.SetSubscribe("kv") })
	// PUB drops messages until the subscription arrives (the slow-joiner
	// problem): publish probes until one is received.
	var first uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.Publish([]Record{removed("m", 9)})
		_ = sub.SetRcvtimeo(50 * time.Millisecond)
		msg, err := sub.RecvMessageBytes(0)
		if err == nil {
			if len(msg) != 3 || string(msg[0]) != "kv" || len(msg[1]) != 8 {
				t.Fatalf("frames %q", msg)
			}
			first = binary.BigEndian.Uint64(msg[1])
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the subscriber never received a probe")
		}
	}
	_ = sub.SetRcvtimeo(10 * time.Second)
	for i := 1; i <= 3; i++ {
		if !p.Publish([]Record{removed("m", i)}) {
			t.Fatal("Publish refused with room in the queue")
		}
	}
	// Skip any probes still in flight, then expect the three batches in order.
	got := recvRemovals(t, sub, 3)
	if got[1] != got[0]+1 || got[2] != got[1]+1 || got[0] <= first {
		t.Fatalf("sequences %v after probe %d: want consecutive", got, first)
	}

	dealer := dial(t, zmq.DEALER, p.ReplayEndpoint(), nil)
	// A malformed request (a 3-byte start) is ignored; the next valid one
	// is answered.
	if _, err := dealer.SendMessage([]byte{}, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], got[1])
	if _, err := dealer.SendMessage([]byte{}, start[:]); err != nil {
		t.Fatal(err)
	}
	var replayed []int64
	for {
		msg, err := dealer.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay receive: %v", err)
		}
		if len(msg) != 3 || len(msg[0]) != 0 {
			t.Fatalf("replay frames %q", msg)
		}
		seq := int64(binary.BigEndian.Uint64(msg[1]))
		if seq == -1 {
			if len(msg[2]) != 0 {
				t.Errorf("end marker payload %q", msg[2])
			}
			break
		}
		replayed = append(replayed, seq)
	}
	if want := []int64{int64(got[1]), int64(got[2])}; !reflect.DeepEqual(replayed, want) {
		t.Errorf("replayed %v, want %v", replayed, want)
	}
}

// TestPublisherQueueFull: with the loop not running, a queue of one takes
// one batch and refuses the next; the recorder counts the refused events.
func TestPublisherQueueFull(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{Endpoint: "inproc://kv-full", MaxQueueSize: 1}, periodic.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var d drops
	r := NewRecorder(nil, p, 1, d.add)
	defer r.Close()
	r.Removed(MediumCPU, []objkey.Key{key(1, "m", 0, "")})
	r.Removed(MediumCPU, []objkey.Key{key(2, "m", 0, ""), key(3, "n", 0, "")})
	if d.n[DropQueueFull] != 2 {
		t.Errorf("drops %v, want 2 publisher_queue_full", d.n)
	}
}

// TestNewConfig: size 0 means no log, an empty endpoint no publisher, a
// negative size is refused.
func TestNewConfig(t *testing.T) {
	r, err := New(Config{LogSize: 0, BlockSize: 4})
	if err != nil || r.Log() != nil || r.Publisher() != nil || r.Enabled() {
		t.Errorf("off: %v %v %v", err, r.Log(), r.Publisher())
	}
	if _, err := New(Config{LogSize: -1}); err == nil {
		t.Error("a negative log size was accepted")
	}
	r, err = New(Config{LogSize: 5})
	if err != nil || r.Log().Capacity() != 5 || !r.Enabled() {
		t.Errorf("log of 5: %v", err)
	}
}

// TestPublisherConnects: an endpoint without "*" or "::" is connected to,
// as vLLM does (a proxy or router binds); batches reach a SUB bound there.
func TestPublisherConnects(t *testing.T) {
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_ = sub.SetLinger(0)
	_ = sub.SetRcvtimeo(50 * time.Millisecond)
	if err := sub.SetSubscribe(""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := sub.GetLastEndpoint()
	p, err := NewPublisher(PublisherConfig{Endpoint: ep}, periodic.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.mode != "connect" || p.Endpoint() != ep || p.ReplayEndpoint() != "" {
		t.Fatalf("mode %q endpoint %q replay %q", p.mode, p.Endpoint(), p.ReplayEndpoint())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.Publish([]Record{removed("m", 1)})
		msg, err := sub.RecvMessageBytes(0)
		if err == nil {
			if len(msg) != 3 || len(msg[0]) != 0 {
				t.Fatalf("frames %q", msg)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing reached the bound SUB")
		}
	}
}

// recvRemovals receives n batches on sub, skipping probes (removals of
// chunk 9), and returns their sequence numbers; batch i must hold the
// removal of chunk i (1-based).
func recvRemovals(t *testing.T, sub *zmq.Socket, n int) []uint64 {
	t.Helper()
	var got []uint64
	for len(got) < n {
		msg, err := sub.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("after sequences %v: receive: %v", got, err)
		}
		ev := fmt.Sprint(decode(t, msg[2]).(map[string]any)["events"])
		if bytes.Contains([]byte(ev), []byte(fmt.Sprint(ExternalHash(hash(9))))) {
			continue
		}
		got = append(got, binary.BigEndian.Uint64(msg[1]))
		if want := fmt.Sprint(ExternalHash(hash(len(got)))); !bytes.Contains([]byte(ev), []byte(want)) {
			t.Errorf("batch %d events %s lack hash %s", len(got), ev, want)
		}
	}
	return got
}
