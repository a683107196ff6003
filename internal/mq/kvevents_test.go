package mq_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvevents"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// pollReply is a decoded POLL_KV_EVENTS result.
type pollReply struct {
	Enabled     bool
	Incarnation int64
	Next        int64
	Lost        bool
	Events      []map[string]any
}

func poll(t *testing.T, w *worker, model string, cursor, max int64) pollReply {
	t.Helper()
	resp, err := w.c.Call(wire.OpPollKVEvents, msgp.AppendString(nil, model), msgp.AppendInt64(nil, cursor), msgp.AppendInt64(nil, max))
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := msgp.ReadIntfBytes(resp)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("POLL_KV_EVENTS reply %v is not a map", v)
	}
	r := pollReply{Enabled: m["enabled"].(bool), Incarnation: m["incarnation"].(int64), Next: m["next_cursor"].(int64), Lost: m["lost"].(bool)}
	for _, e := range m["events"].([]any) {
		r.Events = append(r.Events, e.(map[string]any))
	}
	return r
}

func experimental(t *testing.T, w *worker) string {
	t.Helper()
	resp, err := w.c.Call(wire.OpGetExperimental)
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := msgp.ReadIntfBytes(resp)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(v)
}

// TestKVEventsPollThroughServer: with a log of 5, GET_EXPERIMENTAL
// advertises kv_events; three chunks stored by a worker come back from
// POLL_KV_EVENTS as stored CPU records 1-3 with their tokens, parents
// chained and the blake3 chunk hashes; CLEAR is one removed record with
// all three (never an all-cleared record); two more stores overflow the
// log, so a poll from cursor 0 says lost; a malformed poll gets nil and
// is counted.
func TestKVEventsPollThroughServer(t *testing.T) {
	lg, err := kvevents.NewLog(5)
	if err != nil {
		t.Fatal(err)
	}
	rec := kvevents.NewRecorder(lg, nil, testChunk, nil)
	h := start(t, opts{mq: func(c *mq.Config) { c.KVEvents = rec }})
	h.eng.AddKVEventSink(rec)
	w := h.worker(1, "m", 1, 0)
	if got := experimental(t, w); got != "[kv_events]" {
		t.Fatalf("GET_EXPERIMENTAL = %s", got)
	}
	toks := prompt(1, 3*testChunk)
	if n := w.store(toks, 0, len(toks), "r1", chunkData{}.of(1, 0)); n != 3 {
		t.Fatalf("stored %d chunks", n)
	}
	hasher, _ := tokenhash.New(tokenhash.Blake3, testChunk)
	ids := make([]uint32, len(toks))
	for i, v := range toks {
		ids[i] = uint32(v)
	}
	hashes := hasher.ChunkHashesU32(ids)
	r := poll(t, w, "m", 0, 100)
	if !r.Enabled || r.Lost || r.Next != 3 || len(r.Events) != 3 || r.Incarnation != lg.Incarnation() {
		t.Fatalf("poll: %+v", r)
	}
	checkStoredRecords(t, r.Events, toks, hashes)
	st, err := json.Marshal(h.srv.Status().KVEvents)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`{"enabled":true,"incarnation":%d,"log_capacity":5,"log_depth":3,"lost_markers":0,"next_seq":4,"unbound_stores":0}`, lg.Incarnation()); string(st) != want {
		t.Errorf("status kv_events = %s, want %s", st, want)
	}
	if r := poll(t, w, "other-model", 0, 100); len(r.Events) != 0 || r.Next != 3 {
		t.Errorf("another model's poll: %+v", r)
	}

	if err := w.c.Clear(true); err != nil {
		t.Fatal(err)
	}
	r = poll(t, w, "m", 3, 100)
	if r.Lost || r.Next != 4 || len(r.Events) != 1 || r.Events[0]["kind"] != "removed" || r.Events[0]["medium"] != "CPU" {
		t.Fatalf("after CLEAR: %+v", r)
	}
	got := r.Events[0]["block_hashes"].([]any)
	if len(got) != 3 {
		t.Fatalf("CLEAR removed %d hashes", len(got))
	}
	// A clear removes a set: the table hands its keys back in map order, so
	// compare the removed hashes as a set, each exactly once.
	removed := map[string]int{}
	for _, h := range got {
		removed[string(h.([]byte))]++
	}
	for i, h := range hashes[:3] {
		if removed[string(h)] != 1 {
			t.Errorf("stored hash %d (%x) removed %d times by CLEAR, want once", i, h, removed[string(h)])
		}
	}

	more := prompt(2, 2*testChunk)
	w.store(more, 0, len(more), "r2", chunkData{}.of(2, 0))
	r = poll(t, w, "m", 0, 100)
	if !r.Lost || r.Next != 6 || len(r.Events) != 5 || r.Events[0]["seq"] != int64(2) {
		t.Fatalf("after overflow: lost %v next %d %d events (first %v)", r.Lost, r.Next, len(r.Events), r.Events[0]["seq"])
	}
	if r := poll(t, w, "m", 1, 2); r.Lost || r.Next != 3 || len(r.Events) != 2 {
		t.Errorf("paged poll from the oldest retained: %+v", r)
	}

	resp, err := w.c.Call(wire.OpPollKVEvents, msgp.AppendString(nil, "m"), msgp.AppendInt64(nil, -1), msgp.AppendInt64(nil, 5))
	if err != nil || !bytes.Equal(resp, wire.Nil) {
		t.Errorf("POLL with cursor -1 = %x, %v; want nil", resp, err)
	}
	if resp, err := w.c.Call(wire.OpPollKVEvents, msgp.AppendString(nil, "m")); err != nil || !bytes.Equal(resp, wire.Nil) {
		t.Errorf("POLL with one frame = %x, %v; want nil", resp, err)
	}
	if got := counterValue(h.srv.Metrics().ZMQMalformed.WithLabelValues("payload")); got != 2 {
		t.Errorf("malformed payload counter %v, want 2", got)
	}
}

// TestKVEventsDisabled: without a log GET_EXPERIMENTAL is empty and
// POLL_KV_EVENTS answers enabled=false with no events.
func TestKVEventsDisabled(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	if got := experimental(t, w); got != "[]" {
		t.Errorf("GET_EXPERIMENTAL = %s", got)
	}
	if r := poll(t, w, "m", 0, 10); r.Enabled || r.Lost || r.Next != 0 || len(r.Events) != 0 {
		t.Errorf("poll of a disabled channel: %+v", r)
	}
	if st, err := json.Marshal(h.srv.Status().KVEvents); err != nil || string(st) != `{"enabled":false,"incarnation":0}` {
		t.Errorf("status kv_events = %s, %v", st, err)
	}
}

// TestKVEventsByName: the newest clients send operation names; a client
// that sends "get_experimental" and "poll_kv_events" as strings is served
// like a gen3 numbered one.
func TestKVEventsByName(t *testing.T) {
	lg, err := kvevents.NewLog(4)
	if err != nil {
		t.Fatal(err)
	}
	rec := kvevents.NewRecorder(lg, nil, testChunk, nil)
	h := start(t, opts{mq: func(c *mq.Config) { c.KVEvents = rec }})
	h.clientOpts = mqclient.Options{SendNames: true}
	w := h.worker(1, "m", 1, 0)
	if got := experimental(t, w); got != "[kv_events]" {
		t.Fatalf("GET_EXPERIMENTAL by name = %s", got)
	}
	if r := poll(t, w, "m", 0, 10); !r.Enabled || r.Lost || r.Incarnation != lg.Incarnation() {
		t.Fatalf("POLL_KV_EVENTS by name: %+v", r)
	}
}

// checkStoredRecords checks that events are the CPU "stored" records of
// model "m" for toks, one per chunk in order, seq from 1, each chained to
// the previous chunk's hash.
func checkStoredRecords(t *testing.T, events []map[string]any, toks []wire.Int, hashes [][]byte) {
	t.Helper()
	for i, e := range events {
		var parent any
		if i > 0 {
			parent = hashes[i-1]
		}
		wantToks := make([]any, testChunk)
		for j := range wantToks {
			wantToks[j] = uint64(toks[i*testChunk+j])
		}
		want := map[string]any{"seq": int64(i + 1), "kind": "stored", "medium": "CPU", "model_name": "m", "block_hashes": []any{hashes[i]},
			"parent_block_hash": parent, "token_ids": wantToks, "block_size": int64(testChunk)}
		if fmt.Sprint(e) != fmt.Sprint(want) {
			t.Errorf("record %d\n%v\nwant\n%v", i, e, want)
		}
	}
}

// TestKVEventsPollReplyCapped: however large max_events is, one
// POLL_KV_EVENTS reply carries at most 4096 records (the rest follow from
// its next_cursor), so one poll cannot make the server build an unbounded
// reply.
func TestKVEventsPollReplyCapped(t *testing.T) {
	const records = 5000
	lg, err := kvevents.NewLog(records)
	if err != nil {
		t.Fatal(err)
	}
	for i := range records {
		lg.Append(kvevents.Record{Kind: "removed", Medium: "CPU", Model: "m", Hashes: [][]byte{{byte(i), byte(i >> 8)}}})
	}
	rec := kvevents.NewRecorder(lg, nil, testChunk, nil)
	h := start(t, opts{mq: func(c *mq.Config) { c.KVEvents = rec }})
	w := h.worker(1, "m", 1, 0)
	r := poll(t, w, "m", 0, 1_000_000)
	if len(r.Events) != 4096 || r.Next != 4096 || r.Lost {
		t.Fatalf("first poll: %d events, next %d, lost %v; want 4096, 4096, false", len(r.Events), r.Next, r.Lost)
	}
	if r := poll(t, w, "m", r.Next, 1_000_000); len(r.Events) != records-4096 || r.Next != records || r.Lost {
		t.Fatalf("second poll: %d events, next %d, lost %v; want %d, %d, false", len(r.Events), r.Next, r.Lost, records-4096, records)
	}
}
