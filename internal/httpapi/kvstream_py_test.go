package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os/exec"
	"strconv"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// kvStreamClient is a KV client in Debian's python3 (standard library
// only) that speaks newer upstream's framed protocol the way upstream's
// SDK (lmcache/sdk/kvcache.py around 53754be) does: it reads chunk_size
// from GET /api/status, streams the store as a manifest frame and one
// chunk frame per full chunk (a generator body, so chunked transfer
// encoding), retrieves with Accept: application/x-lmcache-kv-stream and
// protocol_version 1, decodes the answer incrementally, checks the shard
// set (every (chunk, worker) once, each prod(shard_shape) * itemsize
// bytes) and reassembles the [2, L, hit_tokens, hidden * world] tensor.
// The tensor's bytes are a formula the Go side recomputes.
const kvStreamClient = `
import http.client, json, struct, sys

host, port, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
layers, hidden, start, ntok = (int(x) for x in sys.argv[4:8])
ITEM = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4}
PREFIX = struct.Struct("!IQ")

def frame(typ, payload=b"", **fields):
    header = {"version": 1, "type": typ, "payload_length": len(payload)}
    header.update(fields)
    hb = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(len(hb), len(payload)) + hb + payload

def frames(chunks):
    buf = bytearray()
    for piece in chunks:
        buf.extend(piece)
        while len(buf) >= PREFIX.size:
            hl, pl = PREFIX.unpack(buf[:PREFIX.size])
            if len(buf) < PREFIX.size + hl + pl:
                break
            header = json.loads(buf[PREFIX.size:PREFIX.size + hl])
            assert header["version"] == 1 and header["payload_length"] == pl, header
            yield header, bytes(buf[PREFIX.size + hl:PREFIX.size + hl + pl])
            del buf[:PREFIX.size + hl + pl]
    assert not buf, "truncated KV frame stream"

def reads(resp):
    while True:
        b = resp.read(3000)
        if not b:
            return
        yield b

conn = http.client.HTTPConnection(host, port, timeout=30)
conn.request("GET", "/api/status")
r = conn.getresponse()
cs = json.loads(r.read())["chunk_size"]
tokens = list(range(start, start + ntok))
total = len(tokens) // cs * cs
row = hidden * 2
tensor = bytes((i * 31 + 7) % 251 for i in range(2 * layers * total * row))

def store_body():
    yield frame("store_manifest", model_name=model, tokens=tokens, cache_salt="",
                shape=[2, layers, total, hidden], dtype="torch.bfloat16")
    for c in range(total // cs):
        yield frame("store_chunk", b"".join(tensor[(p * total + c * cs) * row:(p * total + (c + 1) * cs) * row]
                                            for p in range(2 * layers)), chunk_index=c)

conn.request("POST", "/api/kv/store", body=store_body(), headers={"Content-Type": "application/x-lmcache-kv-stream; v=1"})
r = conn.getresponse()
store = json.loads(r.read())
assert r.status == 200, (r.status, store)

body = json.dumps({"model_name": model, "tokens": tokens, "cache_salt": "", "protocol_version": 1}, separators=(",", ":"))
conn.request("POST", "/api/kv/retrieve", body=body, headers={"Accept": "application/x-lmcache-kv-stream; v=1", "Content-Type": "application/json"})
r = conn.getresponse()
assert r.status == 200 and r.getheader("Content-Type") == "application/x-lmcache-kv-stream; v=1", (r.status, r.getheaders())
it = frames(reads(r))
man, _ = next(it)
assert man["type"] == "retrieve_manifest", man
item = ITEM[man["dtype"]]
s0, s1, _, s3 = man["shard_shape"]
world, mcs = man["world_size"], man["chunk_size"]
out = bytearray(man["shape"][0] * man["shape"][1] * man["shape"][2] * man["shape"][3] * item)
want = {(c, w) for c in range(man["hit_chunks"]) for w in range(world)}
seen = set()
full_row = s3 * world * item
for h, payload in it:
    assert h["type"] == "retrieve_shard", h
    k = (h["chunk_index"], h["worker_id"])
    assert k in want and k not in seen, k
    assert len(payload) == s0 * s1 * mcs * s3 * item, len(payload)
    for p in range(s0 * s1):
        for t in range(mcs):
            src = (p * mcs + t) * s3 * item
            dst = (p * man["shape"][2] + k[0] * mcs + t) * full_row + k[1] * s3 * item
            out[dst:dst + s3 * item] = payload[src:src + s3 * item]
    seen.add(k)
assert seen == want, "missing shards"
print(json.dumps({"chunk_size": cs, "store": store, "manifest": man, "shards": len(seen), "equal": bytes(out) == tensor}))
`

// TestKVStreamPythonClient: the Python client above stores a two-rank
// bf16 tensor through a real listener and retrieves it framed; the tensor
// it reassembles is byte-exact what it sent, and our raw-body retrieve of
// the same tokens answers those bytes too (recomputed here).
func TestKVStreamPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 (Debian's) is required: %v", err)
	}
	e := startKV(t)
	u, err := url.Parse(e.base)
	if err != nil {
		t.Fatal(err)
	}
	const start, ntok, chunks = 42_000, 3*testChunk + 5, 3
	m := kvTP2
	cmd := exec.Command(py, "-c", kvStreamClient, u.Hostname(), u.Port(), m.name, strconv.Itoa(m.layers), strconv.Itoa(m.hidden), strconv.Itoa(start), strconv.Itoa(ntok))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python client: %v\n%s", err, stderr.String())
	}
	var res struct {
		ChunkSize int            `json:"chunk_size"`
		Store     map[string]any `json:"store"`
		Manifest  map[string]any `json:"manifest"`
		Shards    int            `json:"shards"`
		Equal     bool           `json:"equal"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if !res.Equal || res.ChunkSize != testChunk || res.Shards != chunks*m.world || res.Store["stored_chunks"] != float64(chunks) ||
		res.Manifest["hit_chunks"] != float64(chunks) || res.Manifest["hit_tokens"] != float64(chunks*testChunk) {
		t.Fatalf("python client: %+v", res)
	}
	tensor := make([]byte, 2*m.layers*chunks*testChunk*m.hidden*m.elem)
	for i := range tensor {
		tensor[i] = byte((i*31 + 7) % 251)
	}
	raw := e.expect(200, "POST", "/api/kv/retrieve", map[string]any{"model_name": m.name, "tokens": tokSlice(start, ntok)}, jsonCT)
	if !bytes.Equal(raw.body, tensor) || raw.header.Get("Content-Type") != httpapi.ContentTypeKV {
		t.Fatalf("raw retrieve of the Python client's store: %d bytes, want the %d it sent", len(raw.body), len(tensor))
	}
}

// TestAPIStatusPath: GET /api/status is GET /status (upstream's SDK reads
// chunk_size there), 503 without an engine.
func TestAPIStatusPath(t *testing.T) {
	e := start(t, envOpts{})
	if st := e.expect(200, "GET", "/api/status", nil).json(t); st["chunk_size"] != float64(testChunk) || st["engine_type"] != "MPCacheServer" {
		t.Fatalf("/api/status = %v", st)
	}
	off := start(t, envOpts{noEngine: true})
	if m := off.expect(503, "GET", "/api/status", nil).json(t); m["error"] != "engine not initialized" {
		t.Fatalf("/api/status without an engine = %v", m)
	}
}
