package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/kvevents"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// httpKVFrame is one frame of newer upstream's framed /api/kv protocol
// (12-byte big-endian prefix, compact JSON header, payload).
func httpKVFrame(typ string, payload []byte, extra string) []byte {
	h := fmt.Sprintf(`{"version":1,"type":%q,"payload_length":%d,%s}`, typ, len(payload), extra)
	b := binary.BigEndian.AppendUint32(nil, uint32(len(h)))
	b = binary.BigEndian.AppendUint64(b, uint64(len(payload)))
	return append(append(b, h...), payload...)
}

// kvTensor is a KV_2LTD tensor [2, 2 layers, tokens, 64] of fp16 for the
// worker layout of these tests, its bytes a function of seed.
func kvTensor(tokens int, seed byte) []byte {
	b := make([]byte, 2*2*tokens*64*2)
	for i := range b {
		b[i] = seed + byte(i*13)
	}
	return b
}

// TestKVEventsHTTPStore: /api/kv stores publish like ZMQ stores. On a real
// server with the POLL_KV_EVENTS log and the native publisher, a framed
// store (newer upstream's application/x-lmcache-kv-stream) of 3 chunks and
// a raw-body store (upstream's X-LMCache-Model-Name form) of 2 chunks of
// the model a ZMQ worker registered arrive at a Python SUB (Debian's
// python3-zmq and python3-msgpack, scripts/interop/kv_events_sub.py) as
// BlockStored on CPU and, once uploaded, STORAGE, with each chunk's
// tokens, the chain's parents and the block hashes vLLM computes for the
// same tokens; the subscriber's events equal the POLL_KV_EVENTS log record
// for record, and no store is counted unbound.
func TestKVEventsHTTPStore(t *testing.T) {
	httpPort, zmqPort, pubPort, replayPort := freePort(t), freePort(t), freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	shm := shmName(t, "http")
	pub, replay := "tcp://127.0.0.1:"+itoa(pubPort), "tcp://127.0.0.1:"+itoa(replayPort)
	startServerKV(t, "kv-http", httpPort, zmqPort, shm, "--kv-events-endpoint", pub, "--kv-events-replay-endpoint", replay, "--kv-events-topic", "kv")

	sub := startKVSub(t, pub, replay, "--timeout", "120")

	w := dialWorker(t, zmqPort, shm) // registers "m": 2 layers x 64 fp16
	framedToks := make([]int64, 3*chunkSize+2)
	for i := range framedToks {
		framedToks[i] = int64(7000 + i*3)
	}
	tj, _ := json.Marshal(framedToks)
	tensor := kvTensor(3*chunkSize, 1)
	body := httpKVFrame("store_manifest", nil, fmt.Sprintf(`"model_name":"m","tokens":%s,"cache_salt":"","shape":[2,2,%d,64],"dtype":"torch.float16"`, tj, 3*chunkSize))
	row := 64 * 2
	for c := range 3 {
		var p []byte
		for pl := range 4 {
			off := (pl*3*chunkSize + c*chunkSize) * row
			p = append(p, tensor[off:off+chunkSize*row]...)
		}
		body = append(body, httpKVFrame("store_chunk", p, fmt.Sprintf(`"chunk_index":%d`, c))...)
	}
	var st map[string]any
	if code, _ := call(t, "POST", base+"/api/kv/store", body, map[string]string{"Content-Type": "application/x-lmcache-kv-stream; v=1"}, &st); code != http.StatusOK || st["stored_chunks"] != float64(3) {
		t.Fatalf("framed store = %d %v", code, st)
	}
	rawToks := make([]int64, 2*chunkSize)
	parts := make([]string, len(rawToks))
	for i := range rawToks {
		rawToks[i] = int64(91_000 + i)
		parts[i] = itoa(int(rawToks[i]))
	}
	if code, _ := call(t, "POST", base+"/api/kv/store", kvTensor(2*chunkSize, 9), map[string]string{"X-LMCache-Model-Name": "m",
		"X-LMCache-Tokens": strings.Join(parts, ","), "Content-Type": "application/x-lmcache-kv; v=1"}, &st); code != http.StatusOK || st["stored_chunks"] != float64(2) {
		t.Fatalf("raw-body store = %d %v", code, st)
	}

	// What vLLM computes for the same tokens, and the parents of the chain.
	hasher, err := tokenhash.New(tokenhash.Blake3, chunkSize)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64]uint64{} // hash -> parent (0: none)
	for _, toks := range [][]int64{framedToks, rawToks} {
		hs, err := hasher.ChunkHashes(toks)
		if err != nil {
			t.Fatal(err)
		}
		for i, h := range hs {
			want[kvevents.ExternalHash(h)] = 0
			if i > 0 {
				want[kvevents.ExternalHash(h)] = kvevents.ExternalHash(hs[i-1])
			}
		}
	}
	var log []map[string]any
	waitFor(t, "every HTTP-stored chunk announced on STORAGE too", func() bool {
		log, _, _ = w.pollAll(0)
		return len(log) == 2*len(want)
	})
	perMedium := map[string]int{}
	for i, r := range log {
		if r["kind"] != kvevents.KindStored || r["seq"] != int64(i+1) || len(r["block_hashes"].([]any)) != 1 || len(r["token_ids"].([]any)) != chunkSize {
			t.Fatalf("record %d: %v", i, r)
		}
		h := kvevents.ExternalHash(r["block_hashes"].([]any)[0].([]byte))
		parent, ok := want[h]
		if !ok {
			t.Fatalf("record %d: hash %#x is not one vLLM computes for the stored tokens", i, h)
		}
		if p, _ := r["parent_block_hash"].([]byte); (parent == 0) != (p == nil) || (p != nil && kvevents.ExternalHash(p) != parent) {
			t.Fatalf("record %d: parent %x, the chain says %#x", i, p, parent)
		}
		perMedium[r["medium"].(string)]++
	}
	if perMedium[kvevents.MediumCPU] != len(want) || perMedium[kvevents.MediumStorage] != len(want) {
		t.Fatalf("records per medium %v, want %d each", perMedium, len(want))
	}

	got := sub.expect(t, len(log), 2*time.Minute)
	if len(got.Events) != len(log) {
		t.Fatalf("subscriber got %d events, the log has %d", len(got.Events), len(log))
	}
	for i, ev := range got.Events {
		if !reflect.DeepEqual(ev[1:], vllmEvent(log[i])) {
			t.Fatalf("event %d = %v, the log says %v", i, ev[1:], vllmEvent(log[i]))
		}
	}
	var status struct {
		KV map[string]any `json:"kv_events"`
	}
	if code, _ := call(t, "GET", base+"/status", nil, nil, &status); code != http.StatusOK || status.KV["unbound_stores"] != float64(0) {
		t.Errorf("GET /status kv_events = %v", status.KV)
	}
	if m := metricsText(t, base); strings.Contains(m, `reason="unbound_store"`) {
		t.Errorf("HTTP stores counted unbound:\n%s", grepLines(m, "kv_events_dropped"))
	}
}
