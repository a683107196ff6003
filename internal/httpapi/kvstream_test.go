package httpapi_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// Fixtures of newer upstream's framed KV protocol, written here from the
// protocol's description (kv_protocol.py at 9b3f101): a frame is
// struct.pack("!IQ", len(header), len(payload)) + compact JSON header +
// payload, and every header starts with version, type and payload_length.

// frame encodes one frame; extra is the JSON of the fields after the
// protocol's three (without braces), e.g. `"chunk_index":0`.
func frame(typ string, payload []byte, extra string) []byte {
	h := fmt.Sprintf(`{"version":1,"type":%q,"payload_length":%d`, typ, len(payload))
	if extra != "" {
		h += "," + extra
	}
	h += "}"
	return rawFrame([]byte(h), uint64(len(payload)), payload)
}

// rawFrame is a frame with an arbitrary header and declared payload length.
func rawFrame(header []byte, plen uint64, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(header)))
	b = binary.BigEndian.AppendUint64(b, plen)
	return append(append(b, header...), payload...)
}

func jsonList(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// manifestFrame is upstream's store_manifest for m's tensor of n chunks.
func (m kvModel) manifestFrame(toks []int64, n int, salt, dtype string) []byte {
	return frame("store_manifest", nil, fmt.Sprintf(`"model_name":%q,"tokens":%s,"cache_salt":%q,"shape":[2,%d,%d,%d],"dtype":%q`,
		m.name, jsonList(toks), salt, m.layers, n*testChunk, m.hidden, dtype))
}

// chunkPayload is chunk c of a KV_2LTD tensor of n chunks: the
// [2, layers, chunk, hidden] slice, contiguous, as upstream's client
// slices kv[:, :, start:end, :].
func (m kvModel) chunkPayload(tensor []byte, n, c int) []byte {
	row := m.hidden * m.elem
	var out []byte
	for p := 0; p < 2*m.layers; p++ {
		for t := 0; t < testChunk; t++ {
			off := ((p * n * testChunk) + c*testChunk + t) * row
			out = append(out, tensor[off:off+row]...)
		}
	}
	return out
}

// storeStream is a whole framed store of m's tensor of n chunks.
func (m kvModel) storeStream(toks []int64, tensor []byte, n int, salt string) []byte {
	b := m.manifestFrame(toks, n, salt, "torch.bfloat16")
	for c := 0; c < n; c++ {
		b = append(b, frame("store_chunk", m.chunkPayload(tensor, n, c), fmt.Sprintf(`"chunk_index":%d`, c))...)
	}
	return b
}

// decodedFrame is one frame of a response as a client decodes it.
type decodedFrame struct {
	header  map[string]any
	payload []byte
}

func decodeFrames(t *testing.T, b []byte) []decodedFrame {
	t.Helper()
	var out []decodedFrame
	for len(b) > 0 {
		if len(b) < 12 {
			t.Fatalf("truncated frame prefix (%d bytes)", len(b))
		}
		hl, pl := binary.BigEndian.Uint32(b), binary.BigEndian.Uint64(b[4:])
		if uint64(len(b)) < 12+uint64(hl)+pl {
			t.Fatalf("truncated frame: %d+%d declared, %d left", hl, pl, len(b)-12)
		}
		var f decodedFrame
		dec := json.NewDecoder(bytes.NewReader(b[12 : 12+hl]))
		dec.UseNumber()
		if err := dec.Decode(&f.header); err != nil {
			t.Fatalf("frame header %q: %v", b[12:12+hl], err)
		}
		if f.header["version"] != json.Number("1") || f.header["payload_length"] != json.Number(fmt.Sprint(pl)) {
			t.Fatalf("frame header %v (payload %d)", f.header, pl)
		}
		f.payload = b[12+hl : 12+uint64(hl)+pl]
		out = append(out, f)
		b = b[12+uint64(hl)+pl:]
	}
	return out
}

// streamRetrieve is the request upstream's SDK sends.
func streamRetrieve(e *env, code int, model string, toks []int64, salt string) resp {
	e.t.Helper()
	return e.expect(code, "POST", "/api/kv/retrieve", map[string]any{"model_name": model, "tokens": toks, "cache_salt": salt, "protocol_version": 1},
		map[string]string{"Content-Type": "application/json", "Accept": httpapi.ContentTypeKVStream})
}

var streamCT = map[string]string{"Content-Type": httpapi.ContentTypeKVStream}

// TestKVStreamRoundTrip: newer upstream's framed store (manifest, then one
// chunk frame per full chunk, tokens with a partial tail) of a bf16
// KV_2LTD tensor for one rank and for two ranks answers upstream's store
// JSON; the framed retrieve answers a retrieve_manifest with upstream's
// fields and values, then one retrieve_shard per (chunk, worker) in
// chunk-major order whose payload is exactly that rank's slice of the
// tensor, and the tensor reassembled from the shards is byte-exact the
// one stored; the raw-body (0f6d467) retrieve of the same tokens answers
// the same tensor, so both generations' clients share the cache.
func TestKVStreamRoundTrip(t *testing.T) {
	e := startKV(t)
	for i, m := range []kvModel{kvOne, kvTP2} {
		const n = 3
		start := 5000 * (i + 1)
		toks := tokSlice(start, n*testChunk+5)
		tensor := m.tensor(n, uint64(40+i))
		st := e.expect(200, "POST", "/api/kv/store", m.storeStream(toks, tensor, n, ""), streamCT).json(t)
		wantJSON(t, "store", st, map[string]any{"status": "ok", "total_tokens": float64(n * testChunk), "total_chunks": float64(n),
			"stored_tokens": float64(n * testChunk), "stored_chunks": float64(n)})

		r := streamRetrieve(e, 200, m.name, toks, "")
		if ct := r.header.Get("Content-Type"); ct != httpapi.ContentTypeKVStream {
			t.Errorf("Content-Type = %q", ct)
		}
		frames := decodeFrames(t, r.body)
		if len(frames) != 1+n*m.world {
			t.Fatalf("%s: %d frames, want a manifest and %d shards", m.name, len(frames), n*m.world)
		}
		man := frames[0].header
		want := fmt.Sprintf(`{"chunk_size":%d,"dtype":"torch.bfloat16","hit_chunks":%d,"hit_tokens":%d,"model_name":%q,"payload_length":0,"shape":[2,%d,%d,%d],"shard_shape":[2,%d,%d,%d],"total_chunks":%d,"total_tokens":%d,"type":"retrieve_manifest","version":1,"world_size":%d}`,
			testChunk, n, n*testChunk, m.name, m.layers, n*testChunk, m.hidden, m.layers, testChunk, m.hidden/m.world, n, n*testChunk, m.world)
		if got, _ := json.Marshal(man); string(got) != want {
			t.Fatalf("manifest\n %s\nwant\n %s", got, want)
		}
		back := make([]byte, len(tensor))
		per := m.hidden / m.world * m.elem
		row := m.hidden * m.elem
		for i, f := range frames[1:] {
			c, w := i/m.world, i%m.world
			if f.header["type"] != "retrieve_shard" || f.header["chunk_index"] != json.Number(fmt.Sprint(c)) || f.header["worker_id"] != json.Number(fmt.Sprint(w)) {
				t.Fatalf("shard frame %d: %v", i, f.header)
			}
			if !bytes.Equal(f.payload, m.object(tensor, n, c, w)) {
				t.Fatalf("%s shard (%d, %d) is not the rank's slice of the tensor", m.name, c, w)
			}
			// Place shard [2, L, chunk, hidden/world] into [2, L, tokens, hidden].
			for p := 0; p < 2*m.layers; p++ {
				for tk := 0; tk < testChunk; tk++ {
					src := (p*testChunk + tk) * per
					dst := (p*n*testChunk+c*testChunk+tk)*row + w*per
					copy(back[dst:dst+per], f.payload[src:src+per])
				}
			}
		}
		if !bytes.Equal(back, tensor) {
			t.Fatalf("%s: the reassembled tensor differs from the stored one", m.name)
		}
		if raw := e.expect(200, "POST", "/api/kv/retrieve", map[string]any{"model_name": m.name, "tokens": toks}, jsonCT); !bytes.Equal(raw.body, tensor) {
			t.Fatalf("%s: the raw-body retrieve of a framed store differs", m.name)
		}
	}
	// A raw-body (0f6d467) store is read back framed.
	tensor := kvOne.tensor(2, 77)
	e.expect(200, "POST", "/api/kv/store", tensor, upstreamStore(testModel, tokens(90_000, 2*testChunk), ""))
	frames := decodeFrames(t, streamRetrieve(e, 200, testModel, tokSlice(90_000, 2*testChunk), "").body)
	if len(frames) != 3 || !bytes.Equal(frames[2].payload, kvOne.object(tensor, 2, 1, 0)) {
		t.Fatalf("framed retrieve of a raw-body store: %d frames", len(frames))
	}
}

// TestKVStreamSelection: which form a request gets. A store is framed when
// its Content-Type says so, or when it carries none of the raw forms'
// routing headers (newest upstream reads any store body as frames); a
// retrieve answers frames when it accepts the stream type or names
// protocol_version, else the raw KV_2LTD body; a version other than 1 in
// either place is a 400.
func TestKVStreamSelection(t *testing.T) {
	e := startKV(t)
	toks := tokSlice(300, testChunk)
	tensor := kvOne.tensor(1, 5)
	// No Content-Type, no routing headers: frames.
	e.expect(200, "POST", "/api/kv/store", kvOne.storeStream(toks, tensor, 1, ""), map[string]string{})
	// protocol_version alone asks for frames; Accept alone too.
	for _, req := range []struct {
		body map[string]any
		hdr  map[string]string
	}{
		{map[string]any{"model_name": testModel, "tokens": toks, "protocol_version": 1}, jsonCT},
		{map[string]any{"model_name": testModel, "tokens": toks}, map[string]string{"Content-Type": "application/json", "Accept": "application/x-lmcache-kv-stream"}},
	} {
		r := e.expect(200, "POST", "/api/kv/retrieve", req.body, req.hdr)
		if fs := decodeFrames(t, r.body); len(fs) != 2 || !bytes.Equal(fs[1].payload, tensor) {
			t.Fatalf("framed retrieve %v: %d frames", req, len(fs))
		}
	}
	// Neither: the raw tensor.
	if r := e.expect(200, "POST", "/api/kv/retrieve", map[string]any{"model_name": testModel, "tokens": toks}, jsonCT); !bytes.Equal(r.body, tensor) ||
		r.header.Get("Content-Type") != httpapi.ContentTypeKV {
		t.Fatalf("raw retrieve: %d bytes, %q", len(r.body), r.header.Get("Content-Type"))
	}
	detail := func(r resp) string { return r.json(t)["detail"].(string) }
	if d := detail(e.expect(400, "POST", "/api/kv/retrieve", map[string]any{"model_name": testModel, "tokens": toks, "protocol_version": 2}, jsonCT)); d != "unsupported KV protocol version 2; expected 1" {
		t.Errorf("protocol_version 2: %q", d)
	}
	if d := detail(e.expect(400, "POST", "/api/kv/store", kvOne.storeStream(toks, tensor, 1, ""), map[string]string{"Content-Type": "application/x-lmcache-kv-stream; v=2"})); d != "unsupported KV protocol version 2; expected 1" {
		t.Errorf("Content-Type v=2: %q", d)
	}
}

// TestKVStreamMiss: a framed retrieve that finds nothing is upstream's
// 200 with a manifest of hit_chunks 0 and shape [0, 0, 0, 0] (the shard
// shape and dtype of the layout), and no shard; fewer tokens than a chunk
// answer an all-zero manifest with dtype torch.uint8.
func TestKVStreamMiss(t *testing.T) {
	e := startKV(t)
	r := streamRetrieve(e, 200, kvTP2.name, tokSlice(7, 2*testChunk+1), "")
	fs := decodeFrames(t, r.body)
	want := fmt.Sprintf(`{"chunk_size":%d,"dtype":"torch.bfloat16","hit_chunks":0,"hit_tokens":0,"model_name":"org/tp2","payload_length":0,"shape":[0,0,0,0],"shard_shape":[2,2,%d,8],"total_chunks":2,"total_tokens":%d,"type":"retrieve_manifest","version":1,"world_size":2}`, testChunk, testChunk, 2*testChunk)
	if got, _ := json.Marshal(fs[0].header); len(fs) != 1 || string(got) != want {
		t.Fatalf("miss: %d frames, manifest %s\nwant %s", len(fs), got, want)
	}
	fs = decodeFrames(t, streamRetrieve(e, 200, testModel, tokSlice(7, 3), "").body)
	want = `{"chunk_size":16,"dtype":"torch.uint8","hit_chunks":0,"hit_tokens":0,"model_name":"org/model","payload_length":0,"shape":[0,0,0,0],"shard_shape":[0,0,0,0],"total_chunks":0,"total_tokens":0,"type":"retrieve_manifest","version":1,"world_size":1}`
	if got, _ := json.Marshal(fs[0].header); len(fs) != 1 || string(got) != want {
		t.Fatalf("sub-chunk: %d frames, manifest %s\nwant %s", len(fs), got, want)
	}
}

// TestKVStreamMalformed: every malformed framed store is a 400 naming
// what is wrong (upstream's messages where it has one), and stores
// nothing, not even the valid chunks before the fault; a body over the
// store limit is 413.
func TestKVStreamMalformed(t *testing.T) {
	e := startKV(t,
		`{"model_name":"org/opaque","world_size":1,"object_bytes":512}`)
	const n = 2
	toks := tokSlice(700, n*testChunk)
	tensor := kvOne.tensor(n, 3)
	good := kvOne.storeStream(toks, tensor, n, "")
	man := kvOne.manifestFrame(toks, n, "", "torch.bfloat16")
	chunk := func(i int, p []byte) []byte { return frame("store_chunk", p, fmt.Sprintf(`"chunk_index":%d`, i)) }
	c0, c1 := kvOne.chunkPayload(tensor, n, 0), kvOne.chunkPayload(tensor, n, 1)
	big := binary.BigEndian.AppendUint32(nil, 2<<20)
	big = binary.BigEndian.AppendUint64(big, 0)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"empty body", nil, "KV store request body is missing a manifest frame"},
		{"not frames", []byte("not a kv stream"), "KV frame header too large"},
		{"truncated prefix", good[:7], "truncated KV frame stream"},
		{"truncated payload", good[:len(good)-1], "truncated KV frame stream"},
		{"trailing bytes", cat(good, []byte{0, 0, 0}), "truncated KV frame stream"},
		{"header too large", big, "KV frame header too large: 2097152 bytes"},
		{"header not JSON", rawFrame([]byte("{nope"), 0, nil), "invalid KV frame header"},
		{"header an array", rawFrame([]byte(`[1,2]`), 0, nil), "invalid KV frame header"},
		{"version 2", rawFrame([]byte(`{"version":2,"type":"store_manifest","payload_length":0}`), 0, nil), "unsupported KV protocol version 2; expected 1"},
		{"version a float", rawFrame([]byte(`{"version":1.0,"type":"store_manifest","payload_length":0}`), 0, nil), "KV frame field 'version' must be an int"},
		{"length mismatch", rawFrame([]byte(`{"version":1,"type":"store_manifest","payload_length":3}`), 2, []byte("ab")), "KV frame payload length mismatch: header=3, frame=2"},
		{"type missing", rawFrame([]byte(`{"version":1,"payload_length":0}`), 0, nil), "KV frame field 'type' must be a string"},
		{"chunk first", chunk(0, c0), "expected 'store_manifest' frame, got 'store_chunk'"},
		{"tokens not ints", frame("store_manifest", nil, `"model_name":"org/model","tokens":[1,2.5],"shape":[2,2,16,8],"dtype":"torch.bfloat16"`), "KV frame field 'tokens' must be a list of ints"},
		{"shape of 3", frame("store_manifest", nil, fmt.Sprintf(`"model_name":"org/model","tokens":%s,"shape":[2,2,32],"dtype":"torch.bfloat16"`, jsonList(toks))), "KV frame field 'shape' must contain 4 dimensions"},
		{"salt not a string", frame("store_manifest", nil, fmt.Sprintf(`"model_name":"org/model","tokens":%s,"cache_salt":7,"shape":[2,2,32,8],"dtype":"torch.bfloat16"`, jsonList(toks))), "KV frame field 'cache_salt' must be a string"},
		{"unregistered model", cat(kvModel{name: "nope", layers: 2, hidden: 8}.manifestFrame(toks, n, "", "torch.bfloat16"), chunk(0, c0)), "model_name 'nope' is not registered with this engine"},
		{"dtype mismatch", cat(kvOne.manifestFrame(toks, n, "", "torch.float16"), chunk(0, c0), chunk(1, c1)), "payload dtype torch.float16 does not match registered KV dtype torch.bfloat16"},
		{"unknown dtype", cat(kvOne.manifestFrame(toks, n, "", "torch.quux"), chunk(0, c0)), "unsupported KV dtype 'torch.quux'"},
		{"shape mismatch", cat(kvOne.manifestFrame(toks, 3, "", "torch.bfloat16"), chunk(0, c0), chunk(1, c1)), "payload shape (2, 2, 48, 8) does not match expected (2, 2, 32, 8)"},
		{"chunk out of order", cat(man, chunk(1, c1)), "expected store chunk 0, got 1"},
		{"too few chunks", cat(man, chunk(0, c0)), "expected 2 chunks, got 1"},
		{"too many chunks", cat(good, chunk(2, c1)), "received more chunks than expected (2)"},
		{"short chunk", cat(man, chunk(0, c0), chunk(1, c1[:len(c1)-2])), "chunk 1 byte length 1022 does not match expected 1024"},
		{"oversized chunk", cat(man, chunk(0, c0), rawFrame([]byte(`{"version":1,"type":"store_chunk","payload_length":4294967296,"chunk_index":1}`), 1<<32, nil)),
			"KV store_chunk frame payload of 4294967296 bytes exceeds the 1024 bytes this request allows"},
		{"second manifest", cat(man, chunk(0, c0), man), "expected 'store_chunk' frame, got 'store_manifest'"},
		{"MLA layout", cat(frame("store_manifest", nil, fmt.Sprintf(`"model_name":"org/mla","tokens":%s,"shape":[2,2,32,16],"dtype":"torch.bfloat16"`, jsonList(toks)))),
			"bytes-level KV access requires the KV_2LTD layout"},
		{"opaque layout", frame("store_manifest", nil, fmt.Sprintf(`"model_name":"org/opaque","tokens":%s,"shape":[2,2,32,8],"dtype":"torch.bfloat16"`, jsonList(toks))),
			"does not record num_layers and a known dtype"},
	} {
		r := e.expect(400, "POST", "/api/kv/store", c.body, streamCT)
		if d, _ := r.json(t)["detail"].(string); !strings.Contains(d, c.want) {
			t.Errorf("%s: detail %q, want %q", c.name, d, c.want)
		}
	}
	if lk := e.expect(200, "POST", "/api/kv/lookup", map[string]any{"model_name": testModel, "tokens": toks}, jsonCT).json(t); lk["hit_chunks"] != float64(0) {
		t.Fatalf("a refused framed store left chunks: %v", lk)
	}
	e.expect(200, "POST", "/api/kv/store", good, streamCT)

	small := start(t, envOpts{mutate: func(o *httpapi.Options) { o.MaxKVBodyBytes = 1500 }})
	small.expect(413, "POST", "/api/kv/store", good, streamCT)
}

// binder records the bindings the KV API hands the event recorder.
type binder struct {
	mu     sync.Mutex
	hashes [][]byte
	tokens [][]int64
}

func (b *binder) BindTokens(hashes [][]byte, tokens []int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hashes = append(b.hashes, hashes...)
	b.tokens = append(b.tokens, tokens)
}

// TestKVStoreBindsKVEvents: /api/kv stores, framed and raw-body alike,
// hand the KV event recorder each chunk's hash with the request's tokens
// before the chunks land (so they are published as BlockStored, as ZMQ
// stores are); a salted store binds nothing (it is never published).
func TestKVStoreBindsKVEvents(t *testing.T) {
	b := &binder{}
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.KVEvents = b }})
	hasher, err := tokenhash.New(tokenhash.Blake3, testChunk)
	if err != nil {
		t.Fatal(err)
	}
	toks := tokSlice(800, 2*testChunk+3)
	e.expect(200, "POST", "/api/kv/store", kvOne.storeStream(toks, kvOne.tensor(2, 1), 2, ""), streamCT)
	toks2 := tokSlice(900, testChunk)
	e.expect(200, "POST", "/api/kv/store", kvOne.tensor(1, 2), upstreamStore(testModel, tokens(900, testChunk), ""))
	e.expect(200, "POST", "/api/kv/store", kvOne.tensor(1, 3), upstreamStore(testModel, tokens(950, testChunk), "tenant"))
	want, err := hasher.ChunkHashes(toks)
	if err != nil {
		t.Fatal(err)
	}
	w2, _ := hasher.ChunkHashes(toks2)
	want = append(want, w2...)
	if len(b.hashes) != 3 || len(b.tokens) != 2 || !slices.Equal(b.tokens[0], toks) || !slices.Equal(b.tokens[1], toks2) {
		t.Fatalf("bindings: %d hashes, tokens %v", len(b.hashes), b.tokens)
	}
	for i := range want {
		if !bytes.Equal(b.hashes[i], want[i]) {
			t.Errorf("binding %d: hash %x, want %x", i, b.hashes[i], want[i])
		}
	}
}
