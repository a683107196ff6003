package mq_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestInlineLookupMatchesHandOff runs one scenario on two servers, one
// answering LOOKUP on its socket goroutine (the default
// InlineLookupBytes) and one handing every LOOKUP to a control goroutine
// (InlineLookupBytes -1), each over a real fs L2 directory: a fully
// L1-resident prefix, a prefix whose last two chunks live only in L2, and a
// prompt that diverges in its third chunk. Both must answer the same hits,
// load the same chunks from L2 and retrieve the same bytes.
func TestInlineLookupMatchesHandOff(t *testing.T) {
	run := func(t *testing.T, inline int) []int {
		dir := t.TempDir()
		adapter, err := fs.New(fs.Config{BasePath: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = adapter.Close() })
		h := start(t, opts{l2: []l2.Adapter{adapter}, mq: func(c *mq.Config) { c.InlineLookupBytes = inline }})
		w := h.worker(1, "m", 1, 0)
		sched := h.dial(mqclient.Options{})
		data := chunkData{}
		tokens := prompt(21, 4*testChunk)
		d := data.of(21, 0)
		w.store(tokens, 0, 4*testChunk, "s1", d)
		waitFiles(t, dir, 4)
		if err := sched.Clear(true); err != nil {
			t.Fatal(err)
		}
		// Chunks 0 and 1 back in L1; 2 and 3 only in L2.
		w.store(tokens, 0, 2*testChunk, "s2", d)

		var got []int
		full := key("m", 1, -1, tokens, 0, 2*testChunk, "full-l1")
		got = append(got, lookupOnce(t, sched, full))
		freeLocks(t, sched, full)

		before := h.eng.Counters().PrefetchHitChunksL2
		partial := key("m", 1, -1, tokens, 0, 4*testChunk, "partial-l2")
		got = append(got, lookupOnce(t, sched, partial))
		got = append(got, int(h.eng.Counters().PrefetchHitChunksL2-before))
		if !w.retrieve(tokens, 0, 4*testChunk, "partial-l2", d) {
			t.Fatal("retrieve of the L1+L2 prefix failed")
		}

		diverged := slices.Clone(tokens)
		diverged[2*testChunk+5]++
		div := key("m", 1, -1, diverged, 0, 4*testChunk, "diverged")
		got = append(got, lookupOnce(t, sched, div))
		freeLocks(t, sched, div)
		return got
	}
	want := []int{2, 4, 2, 2} // full-L1 hits, L1+L2 hits, chunks loaded from L2, diverged hits
	results := map[int][]int{}
	for _, inline := range []int{0, -1} {
		t.Run(fmt.Sprintf("inline=%d", inline), func(t *testing.T) {
			results[inline] = run(t, inline)
			if !slices.Equal(results[inline], want) {
				t.Errorf("hits %v, want %v", results[inline], want)
			}
		})
	}
	if !slices.Equal(results[0], results[-1]) {
		t.Errorf("inline LOOKUP answered %v, the handed-off one %v", results[0], results[-1])
	}
}

// TestInlineLookupPipelinedStatus sends LOOKUP and QUERY_PREFETCH_STATUS
// back to back on one DEALER, without waiting for LOOKUP's reply, as the
// inline LOOKUP's early reply lets a client do in effect: the status query
// must still see the job that LOOKUP started (3 of the 4 chunks stored),
// never "no job" (0), and the replies come in request order.
func TestInlineLookupPipelinedStatus(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	tokens := prompt(31, 4*testChunk)
	data := chunkData{}
	w.store(tokens, 0, 3*testChunk, "s", data.of(31, 0))

	sock, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	_ = sock.SetLinger(0)
	_ = sock.SetRcvtimeo(20 * time.Second)
	if err := sock.Connect(h.endpoint); err != nil {
		t.Fatal(err)
	}
	op := func(o wire.Op) []byte { id, _ := wire.Gen3.ID(o); return wire.EncodeInt(id) }
	send := func(frames ...[]byte) {
		t.Helper()
		if _, err := sock.SendMessage(frames); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() [][]byte {
		t.Helper()
		msg, err := sock.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	send(wire.EncodeInt(1), op(wire.OpGetChunkSize))
	if m := recv(); len(m) != 3 || !bytes.Equal(m[2], wire.EncodeInt(testChunk)) {
		t.Fatalf("GET_CHUNK_SIZE reply %x", m)
	}
	sched := h.dial(mqclient.Options{})
	for i := range 20 {
		id := fmt.Sprint("pipelined-", i)
		k := key("m", 1, -1, tokens, 0, 4*testChunk, id)
		send(wire.EncodeInt(int64(2*i+2)), op(wire.OpLookup), wire.Marshal(k), wire.EncodeInt(1))
		send(wire.EncodeInt(int64(2*i+3)), op(wire.OpQueryPrefetchStatus), msgp.AppendString(nil, id))
		if m := recv(); len(m) != 3 || !bytes.Equal(m[0], wire.EncodeInt(int64(2*i+2))) || !bytes.Equal(m[2], wire.Nil) {
			t.Fatalf("round %d: LOOKUP reply %x, want uid %d and nil", i, m, 2*i+2)
		}
		if m := recv(); len(m) != 3 || !bytes.Equal(m[0], wire.EncodeInt(int64(2*i+3))) || !bytes.Equal(m[2], wire.EncodeInt(3)) {
			t.Fatalf("round %d: QUERY_PREFETCH_STATUS reply %x, want uid %d and 3 chunks", i, m, 2*i+3)
		}
		freeLocks(t, sched, k)
	}
}
