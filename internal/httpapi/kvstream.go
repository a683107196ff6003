package httpapi

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// The framed KV transfer protocol of newer upstream (its http_apis
// kv_protocol.py and kv_bytes.py, read at 53754be / 9b3f101, and kv_api.py
// at 772fdcd): a body is a sequence of frames, each a 12-byte big-endian
// prefix (uint32 header length, uint64 payload length), a compact JSON
// object header carrying at least "version" (1), "type" and
// "payload_length", then the payload. A store is one store_manifest frame
// followed by one store_chunk frame per full token chunk (the chunk's
// [2, num_layers, chunk_size, hidden * world_size] slice of the KV_2LTD
// tensor, ranks side by side along the hidden dim); a retrieve answer is
// one retrieve_manifest frame followed by one retrieve_shard frame per
// (chunk, worker), each a rank's [2, num_layers, chunk_size, hidden]
// object as stored.
const (
	// ContentTypeKVStream is the media type of a framed body.
	ContentTypeKVStream = "application/x-lmcache-kv-stream; v=1"
	mediaKVStream       = "application/x-lmcache-kv-stream"
	kvProtocolVersion   = 1
	kvFramePrefix       = 12
	// kvMaxFrameHeader is upstream's bound on one frame's JSON header.
	kvMaxFrameHeader = 1 << 20
)

// Frame types of protocol version 1.
const (
	frameStoreManifest    = "store_manifest"
	frameStoreChunk       = "store_chunk"
	frameRetrieveManifest = "retrieve_manifest"
	frameRetrieveShard    = "retrieve_shard"
)

// errStreamEnd is a frame stream that ended cleanly on a frame boundary.
var errStreamEnd = errors.New("end of KV frame stream")

// kvFrame is one decoded frame.
type kvFrame struct {
	header  map[string]json.RawMessage
	typ     string
	payload []byte
}

// frameReader decodes frames from a request body. Each frame's read gets
// its own deadline (the body read timeout per started 16 MiB of the
// frame), so a large store is not cut off by one fixed deadline while a
// trickling client still cannot hold the connection.
type frameReader struct {
	r        io.Reader
	w        http.ResponseWriter
	timeout  time.Duration
	prefix   [kvFramePrefix]byte
	consumed bool
}

// next reads one frame whose payload may be at most maxPayload bytes
// (larger declared payloads are refused before they are read). It returns
// errStreamEnd at a clean end of the body.
func (fr *frameReader) next(maxPayload int64) (kvFrame, error) {
	fr.deadline(kvFramePrefix + kvMaxFrameHeader)
	n, err := io.ReadFull(fr.r, fr.prefix[:])
	switch {
	case n == 0 && errors.Is(err, io.EOF):
		return kvFrame{}, errStreamEnd
	case errors.Is(err, io.ErrUnexpectedEOF):
		return kvFrame{}, errf(ErrBadRequest, "truncated KV frame stream")
	case err != nil:
		return kvFrame{}, httproute.BodyError(err)
	}
	fr.consumed = true
	hlen := binary.BigEndian.Uint32(fr.prefix[:4])
	plen := binary.BigEndian.Uint64(fr.prefix[4:])
	if hlen > kvMaxFrameHeader {
		return kvFrame{}, errf(ErrBadRequest, "KV frame header too large: %d bytes", hlen)
	}
	hdr := make([]byte, hlen)
	if _, err := io.ReadFull(fr.r, hdr); err != nil {
		return kvFrame{}, frameReadErr(err)
	}
	f, err := decodeFrameHeader(hdr, plen)
	if err != nil {
		return f, err
	}
	if plen > uint64(maxPayload) {
		return f, errf(ErrBadRequest, "KV %s frame payload of %d bytes exceeds the %d bytes this request allows", f.typ, plen, maxPayload)
	}
	fr.deadline(int64(plen))
	f.payload = make([]byte, plen)
	if _, err := io.ReadFull(fr.r, f.payload); err != nil {
		return f, frameReadErr(err)
	}
	return f, nil
}

func (fr *frameReader) deadline(n int64) {
	if fr.timeout > 0 {
		_ = http.NewResponseController(fr.w).SetReadDeadline(time.Now().Add(httproute.ScaledDeadline(fr.timeout, bodyReadUnit, n)))
	}
}

// frameReadErr maps a failed read inside a frame: an early end is a
// truncated stream (400), the rest as any body read.
func frameReadErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errf(ErrBadRequest, "truncated KV frame stream")
	}
	return httproute.BodyError(err)
}

// decodeFrameHeader checks a frame header as upstream's decoder does: a
// JSON object whose version is 1, whose payload_length matches the
// prefix, and whose type is a string.
func decodeFrameHeader(b []byte, plen uint64) (kvFrame, error) {
	var f kvFrame
	if err := httproute.DecodeJSON(b, &f.header); err != nil || f.header == nil {
		if err == nil {
			err = errors.New("not a single JSON object")
		}
		return f, errf(ErrBadRequest, "invalid KV frame header: %v", err)
	}
	v, err := frameInt(f.header, "version")
	if err != nil {
		return f, err
	}
	if v != kvProtocolVersion {
		return f, errf(ErrBadRequest, "unsupported KV protocol version %d; expected %d", v, kvProtocolVersion)
	}
	pl, err := frameInt(f.header, "payload_length")
	if err != nil {
		return f, err
	}
	if pl < 0 || uint64(pl) != plen {
		return f, errf(ErrBadRequest, "KV frame payload length mismatch: header=%d, frame=%d", pl, plen)
	}
	f.typ, err = frameStr(f.header, "type", false)
	return f, err
}

func (f kvFrame) require(typ string) error {
	if f.typ != typ {
		return errf(ErrBadRequest, "expected '%s' frame, got '%s'", typ, f.typ)
	}
	return nil
}

// frameInt reads an integer field: a JSON number without fraction or
// exponent, as Python's isinstance(v, int) accepts.
func frameInt(h map[string]json.RawMessage, key string) (int64, error) {
	raw := strings.TrimSpace(string(h[key]))
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, errf(ErrBadRequest, "KV frame field '%s' must be an int", key)
	}
	return n, nil
}

func frameStr(h map[string]json.RawMessage, key string, optional bool) (string, error) {
	raw, ok := h[key]
	if !ok && optional {
		return "", nil
	}
	var s string
	if !ok || json.Unmarshal(raw, &s) != nil || !strings.HasPrefix(strings.TrimSpace(string(raw)), `"`) {
		return "", errf(ErrBadRequest, "KV frame field '%s' must be a string", key)
	}
	return s, nil
}

func frameInts(h map[string]json.RawMessage, key string) ([]int64, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(h[key], &raws); err != nil || raws == nil {
		return nil, errf(ErrBadRequest, "KV frame field '%s' must be a list of ints", key)
	}
	out := make([]int64, len(raws))
	for i, r := range raws {
		n, err := strconv.ParseInt(strings.TrimSpace(string(r)), 10, 64)
		if err != nil {
			return nil, errf(ErrBadRequest, "KV frame field '%s' must be a list of ints", key)
		}
		out[i] = n
	}
	return out, nil
}

func frameShape(h map[string]json.RawMessage, key string) ([4]int64, error) {
	var s [4]int64
	v, err := frameInts(h, key)
	if err != nil {
		return s, err
	}
	if len(v) != 4 {
		return s, errf(ErrBadRequest, "KV frame field '%s' must contain 4 dimensions", key)
	}
	copy(s[:], v)
	return s, nil
}

// frameHead encodes the prefix and JSON header of a frame with a plen-byte
// payload: the protocol fields first, then fields (key, value pairs) in
// order, compact as upstream's encoder writes them.
func frameHead(typ string, plen int, fields ...any) []byte {
	var h bytes.Buffer
	fmt.Fprintf(&h, `{"version":%d,"type":%q,"payload_length":%d`, kvProtocolVersion, typ, plen)
	for i := 0; i+1 < len(fields); i += 2 {
		v, _ := json.Marshal(fields[i+1])
		fmt.Fprintf(&h, `,%q:%s`, fields[i], v)
	}
	h.WriteByte('}')
	b := make([]byte, 0, kvFramePrefix+h.Len())
	b = binary.BigEndian.AppendUint32(b, uint32(h.Len()))
	b = binary.BigEndian.AppendUint64(b, uint64(plen))
	return append(b, h.Bytes()...)
}

// isKVStream reports whether a media-type header value names the framed
// protocol; a v parameter other than 1 is refused.
func isKVStream(v string) (bool, error) {
	for _, part := range strings.Split(v, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || !strings.EqualFold(mt, mediaKVStream) {
			continue
		}
		if ver, ok := params["v"]; ok && ver != strconv.Itoa(kvProtocolVersion) {
			return true, errf(ErrBadRequest, "unsupported KV protocol version %s; expected %d", ver, kvProtocolVersion)
		}
		return true, nil
	}
	return false, nil
}

// storeIsStream picks the store form: the framed protocol when the body
// says so (Content-Type), or when none of the raw-body forms' routing
// headers is present (newest upstream reads every store body as frames,
// whatever its Content-Type).
func storeIsStream(r *http.Request) (bool, error) {
	if ok, err := isKVStream(r.Header.Get("Content-Type")); ok || err != nil {
		return ok, err
	}
	for _, h := range []string{HeaderModelName, HeaderModel, HeaderTokens} {
		if r.Header.Get(h) != "" {
			return false, nil
		}
	}
	return true, nil
}

// kvShard is the per-rank geometry of the framed protocol: a rank's chunk
// object is [2, num_layers, chunk_size, hidden] elements of dtype.
type kvShard struct {
	shape [4]int64
	dtype string // canonical torch name without the "torch." prefix
	item  int64
}

func (g kvShard) bytes() int64 { return g.shape[0] * g.shape[1] * g.shape[2] * g.shape[3] * g.item }

// torchName is a dtype as Python's str(torch.dtype) prints it.
func (g kvShard) torchName() string { return "torch." + g.dtype }

// dtypeAliases are torch's attribute aliases of the canonical names.
var dtypeAliases = map[string]string{"half": "float16", "float": "float32", "double": "float64",
	"short": "int16", "int": "int32", "long": "int64", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}

// canonicalDtype resolves a dtype name as upstream's getattr(torch, name)
// does (with or without the "torch." prefix).
func canonicalDtype(name string) (string, int64, bool) {
	n := strings.TrimPrefix(strings.TrimSpace(name), "torch.")
	if a, ok := dtypeAliases[n]; ok {
		n = a
	}
	item, ok := wire.DtypeSize(n)
	if !ok || n == "fp8" {
		return "", 0, false
	}
	return n, item, true
}

// kvShardOf derives the per-rank shard geometry of a registered layout:
// one KV group whose objects are [2, num_layers, chunk, hidden] of a
// known dtype. Hybrid layouts and MLA's 3-D objects get upstream's 400s.
func kvShardOf(l engine.Layout, chunk int) (kvShard, error) {
	if len(l.GroupObjectBytes) > 1 {
		return kvShard{}, errf(ErrBadRequest, "bytes-level KV access currently supports a single KV layer group (homogeneous attention only); hybrid-attention models with multiple layer groups are not supported in v1 (got %d groups)", len(l.GroupObjectBytes))
	}
	mla, _ := l.Meta["use_mla"].(bool)
	if v, ok := l.Meta["is_mla"].(bool); ok {
		mla = mla || v
	}
	if mla {
		return kvShard{}, errf(ErrBadRequest, "bytes-level KV access requires the KV_2LTD layout (shape [2, num_layers, num_tokens, hidden_dim]); model_name '%s' is MLA, whose objects are 3-D", l.ModelName)
	}
	dt, _ := l.Meta["dtype"].(string)
	name, item, ok := canonicalDtype(dt)
	layers, lok := metaInt(l.Meta, "num_layers")
	if !ok || !lok || layers < 1 || chunk < 1 {
		return kvShard{}, errf(ErrBadRequest, "the layout registered for model_name '%s' (world_size=%d) does not record num_layers and a known dtype, so it cannot be described as KV_2LTD shards", l.ModelName, l.WorldSize)
	}
	row := 2 * layers * int64(chunk) * item
	if l.ObjectBytes%row != 0 || l.ObjectBytes/row < 1 {
		return kvShard{}, errf(ErrBadRequest, "the layout registered for model_name '%s' has %d-byte chunk objects, which is not [2, %d, %d, hidden] of %s", l.ModelName, l.ObjectBytes, layers, chunk, name)
	}
	return kvShard{shape: [4]int64{2, layers, int64(chunk), l.ObjectBytes / row}, dtype: name, item: item}, nil
}

// shapeStr prints a shape as Python prints a tuple, as upstream's messages do.
func shapeStr(s [4]int64) string { return fmt.Sprintf("(%d, %d, %d, %d)", s[0], s[1], s[2], s[3]) }

// storeManifest is the decoded first frame of a framed store.
type storeManifest struct {
	req   kvRequest
	shape [4]int64
	dtype string
}

func decodeStoreManifest(f kvFrame) (storeManifest, error) {
	var m storeManifest
	if err := f.require(frameStoreManifest); err != nil {
		return m, err
	}
	var err error
	if m.req.model, err = frameStr(f.header, "model_name", false); err != nil {
		return m, err
	}
	if m.req.tokens, err = frameInts(f.header, "tokens"); err != nil {
		return m, err
	}
	if m.req.salt, err = frameStr(f.header, "cache_salt", true); err != nil {
		return m, err
	}
	if m.shape, err = frameShape(f.header, "shape"); err != nil {
		return m, err
	}
	if m.dtype, err = frameStr(f.header, "dtype", false); err != nil {
		return m, err
	}
	m.req.upstream, m.req.worldSize = true, 1
	switch {
	case m.req.model == "" || strings.Contains(m.req.model, "@"):
		return m, errf(ErrBadRequest, "model_name must be non-empty and must not contain '@'")
	case objkey.ValidateSalt(m.req.salt) != nil:
		return m, errf(ErrBadRequest, "cache_salt: %v", objkey.ValidateSalt(m.req.salt))
	}
	return m, checkTokens(m.req.tokens, "tokens")
}

// handleKVStoreStream is POST /api/kv/store in the framed protocol. The
// frames are read and checked one by one (each chunk's payload bounded by
// its expected size, the whole body by MaxKVBodyBytes); nothing is stored
// unless the whole stream is valid, then every chunk is stored at once.
func (s *Server) handleKVStoreStream(w http.ResponseWriter, r *http.Request) error {
	e, err := s.engineOr("engine not initialized")
	if err != nil {
		return err
	}
	// The stream is read frame by frame, never buffered whole, so
	// httproute.ReadBody (which reads the body into one buffer) cannot
	// apply; the toolkit's LimitBody bounds it instead (a declared length
	// over the limit is refused before a byte is read) and its BodyError
	// maps the read errors, so the statuses are ReadBody's. The deadline
	// is set per frame by frameReader, not once for the whole body.
	if err := httproute.LimitBody(w, r, s.opts.MaxKVBodyBytes, 0); err != nil {
		return err
	}
	fr := &frameReader{r: r.Body, w: w, timeout: s.opts.BodyReadTimeout}
	f, err := fr.next(kvMaxFrameHeader)
	if errors.Is(err, errStreamEnd) {
		return errf(ErrBadRequest, "KV store request body is missing a manifest frame")
	}
	if err != nil {
		return err
	}
	m, err := decodeStoreManifest(f)
	if err != nil {
		return err
	}
	req := m.req
	if v := r.Header.Get(HeaderWorldSize); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > 255 {
			return errf(ErrBadRequest, "%s must be an integer in [1, 255] (got %q)", HeaderWorldSize, v)
		}
		req.worldSize, req.worldSet = n, true
	}
	l, err := kvLayout(e, req)
	if err != nil {
		return err
	}
	chunks, err := s.chunkKeys(l, req.tokens, req.salt)
	if err != nil {
		return err
	}
	cs := s.hasher.ChunkSize()
	if len(chunks) == 0 {
		writeJSON(w, http.StatusOK, KVStoreResponse{Status: "ok"})
		return nil
	}
	g, err := kvShardOf(l, cs)
	if err != nil {
		return err
	}
	dt, _, ok := canonicalDtype(m.dtype)
	if !ok {
		return errf(ErrBadRequest, "unsupported KV dtype '%s'", m.dtype)
	}
	if dt != g.dtype {
		return errf(ErrBadRequest, "payload dtype torch.%s does not match registered KV dtype %s", dt, g.torchName())
	}
	world := int64(l.WorldSize)
	want := [4]int64{g.shape[0], g.shape[1], int64(len(chunks) * cs), g.shape[3] * world}
	if m.shape != want {
		return errf(ErrBadRequest, "payload shape %s does not match expected %s", shapeStr(m.shape), shapeStr(want))
	}
	chunkBytes := world * g.bytes()
	need := int64(len(chunks)) * chunkBytes
	// Chunks the manifest announces past the per-request limit can never
	// arrive (LimitBody stops the body first): refuse them now, as the
	// raw-body form does, instead of taking up to the whole budget for a
	// store that can only end in 413 after its client has sent the limit.
	if need > s.opts.MaxKVBodyBytes {
		return errf(ErrTooLarge, "store of %d bytes exceeds the %d-byte limit", need, s.opts.MaxKVBodyBytes)
	}
	// The chunks are kept until the whole stream is valid, so the budget
	// is taken for all of them (known from the manifest) before the first
	// chunk frame is read; more chunks, or larger ones, are refused below.
	// The manifest frame itself (at most 2 MiB) is not counted.
	release, err := s.reserve(w, "store", need)
	if err != nil {
		return err
	}
	defer release()
	keys := make([]objkey.Key, 0, len(chunks)*int(world))
	data := make([][]byte, 0, len(chunks)*int(world))
	for idx := 0; ; idx++ {
		f, err := fr.next(chunkBytes)
		if errors.Is(err, errStreamEnd) {
			if idx != len(chunks) {
				return errf(ErrBadRequest, "expected %d chunks, got %d", len(chunks), idx)
			}
			break
		}
		if err != nil {
			return err
		}
		if err := f.require(frameStoreChunk); err != nil {
			return err
		}
		ci, err := frameInt(f.header, "chunk_index")
		if err != nil {
			return err
		}
		if ci != int64(idx) {
			return errf(ErrBadRequest, "expected store chunk %d, got %d", idx, ci)
		}
		if idx >= len(chunks) {
			return errf(ErrBadRequest, "received more chunks than expected (%d)", len(chunks))
		}
		if int64(len(f.payload)) != chunkBytes {
			return errf(ErrBadRequest, "chunk %d byte length %d does not match expected %d", idx, len(f.payload), chunkBytes)
		}
		keys = append(keys, chunks[idx]...)
		data = append(data, g.splitChunk(f.payload, l.WorldSize)...)
	}
	s.bindKVEvents(chunks, req)
	stored, err := s.putKV(r, e, keys, data)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, KVStoreResponse{
		Status: "ok", TotalTokens: len(chunks) * cs, TotalChunks: len(chunks), StoredTokens: len(chunks) * cs, StoredChunks: len(chunks),
		Chunks: len(chunks), Tokens: len(chunks) * cs, Keys: len(keys), Stored: stored,
	})
	return nil
}

// splitChunk cuts one chunk's [2, L, chunk, hidden*world] payload into the
// world rank objects [2, L, chunk, hidden] (rank r holds hidden slice r).
func (g kvShard) splitChunk(p []byte, world int) [][]byte {
	row := g.shape[3] * g.item
	rows := g.shape[0] * g.shape[1] * g.shape[2]
	out := make([][]byte, world)
	for r := range out {
		obj := make([]byte, g.bytes())
		for i := range rows {
			src := i*row*int64(world) + int64(r)*row
			copy(obj[i*row:(i+1)*row], p[src:src+row])
		}
		out[r] = obj
	}
	return out
}

// bindKVEvents hands the KV event recorder the tokens of an HTTP store's
// chunks before they land, so their BlockStored records carry what a
// router indexes by (as the ZMQ stores do). Salted stores are not
// published (vLLM folds the salt into its hashes).
func (s *Server) bindKVEvents(chunks [][]objkey.Key, req kvRequest) {
	if s.opts.KVEvents == nil || req.salt != "" || len(chunks) == 0 {
		return
	}
	hashes := make([][]byte, len(chunks))
	for i, ck := range chunks {
		hashes[i] = []byte(ck[0].ChunkHash)
	}
	s.opts.KVEvents.BindTokens(hashes, req.tokens)
}

// retrieveStream answers a framed retrieve: the manifest (upstream's
// fields; a miss is 200 with hit_chunks 0 and shape [0, 0, 0, 0]) and one
// shard frame per (chunk, worker) of the hit prefix.
func (s *Server) retrieveStream(w http.ResponseWriter, l engine.Layout, req kvRequest, total int, g kvShard, objs [][]byte, hit int) {
	cs := s.hasher.ChunkSize()
	world := l.WorldSize
	shape := [4]int64{}
	if hit > 0 {
		shape = [4]int64{g.shape[0], g.shape[1], int64(hit * cs), g.shape[3] * int64(world)}
	}
	dtype := "torch.uint8"
	if g.dtype != "" {
		dtype = g.torchName()
	}
	manifest := frameHead(frameRetrieveManifest, 0,
		"model_name", req.model, "total_tokens", total*cs, "total_chunks", total, "hit_tokens", hit*cs, "hit_chunks", hit,
		"chunk_size", cs, "world_size", world, "shape", shape[:], "shard_shape", g.shape[:], "dtype", dtype)
	size := len(manifest)
	heads := make([][]byte, hit*world)
	for i := range heads {
		heads[i] = frameHead(frameRetrieveShard, len(objs[i]), "chunk_index", i/world, "worker_id", i%world)
		size += len(heads[i]) + len(objs[i])
	}
	w.Header().Set("Content-Type", ContentTypeKVStream)
	w.Header().Set("Content-Length", strconv.Itoa(size))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(manifest); err != nil {
		return
	}
	for i, h := range heads {
		if _, err := w.Write(h); err != nil {
			return
		}
		if _, err := w.Write(objs[i]); err != nil {
			return
		}
	}
}
