package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Headers of the bytes-level KV API. HeaderModelName, HeaderTokens,
// HeaderCacheSalt and the four hit/total headers are upstream's
// (lmcache/v1/multiprocess/http_apis/kv_api.py); HeaderModel,
// HeaderWorldSize and the L1/L2 key counts are ours.
const (
	HeaderModelName   = "X-LMCache-Model-Name"
	HeaderModel       = "X-LMCache-Model"
	HeaderTokens      = "X-LMCache-Tokens"
	HeaderCacheSalt   = "X-LMCache-Cache-Salt"
	HeaderWorldSize   = "X-LMCache-World-Size"
	HeaderHitChunks   = "X-LMCache-Hit-Chunks"
	HeaderHitTokens   = "X-LMCache-Hit-Tokens"
	HeaderTotalChunks = "X-LMCache-Total-Chunks"
	HeaderTotalTokens = "X-LMCache-Total-Tokens"
	HeaderL1Keys      = "X-LMCache-L1-Keys"
	HeaderL2Keys      = "X-LMCache-L2-Keys"
)

// ContentTypeKV is upstream's media type of a KV_2LTD payload (the store
// body and the retrieve answer of upstream's form).
const ContentTypeKV = "application/x-lmcache-kv; v=1"

// kvRequest is the parsed request of a /api/kv/* call.
type kvRequest struct {
	model     string
	worldSize int
	// worldSet: the client named the world size; otherwise upstream's form
	// uses the model's one registered layout, ours world size 1.
	worldSet bool
	salt     string
	tokens   []int64
	// upstream: the request is upstream's form (X-LMCache-Model-Name, or a
	// JSON body), so payloads are KV_2LTD tensors; otherwise (X-LMCache-Model)
	// they are our raw per-chunk, per-rank L1 objects.
	upstream bool
	// protocol is the body's protocol_version (newer upstream's framed
	// retrieve; 0 when absent).
	protocol int64
}

func parseKVHeaders(h http.Header) (kvRequest, error) {
	req := kvRequest{model: h.Get(HeaderModelName), salt: h.Get(HeaderCacheSalt), worldSize: 1, upstream: true}
	if ours := h.Get(HeaderModel); ours != "" {
		if req.model != "" && req.model != ours {
			return req, errf(ErrBadRequest, "%s and %s name different models", HeaderModelName, HeaderModel)
		}
		req.model, req.upstream = ours, req.model != ""
	}
	if req.model == "" {
		return req, errf(ErrBadRequest, "missing %s header", HeaderModelName)
	}
	if strings.Contains(req.model, "@") {
		return req, errf(ErrBadRequest, "the model name must not contain '@'")
	}
	if v := h.Get(HeaderWorldSize); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > 255 {
			return req, errf(ErrBadRequest, "%s must be an integer in [1, 255] (got %q)", HeaderWorldSize, v)
		}
		req.worldSize, req.worldSet = n, true
	}
	if err := objkey.ValidateSalt(req.salt); err != nil {
		return req, errf(ErrBadRequest, "%s: %v", HeaderCacheSalt, err)
	}
	if strings.Trim(h.Get(HeaderTokens), ", \t") == "" {
		return req, errf(ErrBadRequest, "%s header must contain at least one token", HeaderTokens)
	}
	toks, err := parseTokens(h.Get(HeaderTokens))
	if err != nil {
		return req, err
	}
	req.tokens = toks
	return req, nil
}

// decodeKVBody parses upstream's JSON body for /api/kv/retrieve and
// /api/kv/lookup: {"model_name", "tokens", "cache_salt"} (plus our
// "world_size", default 1, and newer upstream's "protocol_version", which
// asks a retrieve for the framed answer; other fields are ignored). Shape
// errors are 422; bad values get the header form's 400s.
func decodeKVBody(body []byte) (kvRequest, error) {
	var in struct {
		ModelName *string  `json:"model_name"`
		Tokens    *[]int64 `json:"tokens"`
		CacheSalt *string  `json:"cache_salt"`
		WorldSize *int     `json:"world_size"`
		Protocol  *int64   `json:"protocol_version"`
	}
	if err := decodeStrict(body, &in); err != nil {
		return kvRequest{}, err
	}
	switch {
	case in.ModelName == nil:
		return kvRequest{}, missing("body", "model_name")
	case in.Tokens == nil:
		return kvRequest{}, missing("body", "tokens")
	}
	req := kvRequest{model: *in.ModelName, tokens: *in.Tokens, worldSize: 1, upstream: true}
	if in.CacheSalt != nil {
		req.salt = *in.CacheSalt
	}
	if in.Protocol != nil {
		req.protocol = *in.Protocol
	}
	if in.WorldSize != nil {
		if *in.WorldSize < 1 || *in.WorldSize > 255 {
			return req, invalid("less_than_equal", "Input should be between 1 and 255", "body", "world_size")
		}
		req.worldSize, req.worldSet = *in.WorldSize, true
	}
	if req.model == "" || strings.Contains(req.model, "@") {
		return req, errf(ErrBadRequest, "model_name must be non-empty and must not contain '@'")
	}
	if err := objkey.ValidateSalt(req.salt); err != nil {
		return req, errf(ErrBadRequest, "cache_salt: %v", err)
	}
	if err := checkTokens(req.tokens, "tokens"); err != nil {
		return req, err
	}
	return req, nil
}

// jsonBody reports whether a /api/kv read carries its request as JSON
// (upstream's form) rather than in X-LMCache-* headers.
func jsonBody(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), ctJSON)
}

// kvSetup resolves the engine, layout and chunk keys of a KV request.
// Reads (allowBody) take the request from a JSON body when the client
// sends one, which has room for long token lists; the header form is
// bounded by the server's header limit (about 20,000 ids).
func (s *Server) kvSetup(w http.ResponseWriter, r *http.Request, allowBody bool) (Engine, engine.Layout, kvRequest, [][]objkey.Key, error) {
	var req kvRequest
	var err error
	if allowBody && jsonBody(r) {
		var body []byte
		if body, err = s.readBody(w, r, maxJSONBody); err == nil {
			req, err = decodeKVBody(body)
		}
	} else {
		req, err = parseKVHeaders(r.Header)
	}
	if err != nil {
		return nil, engine.Layout{}, req, nil, err
	}
	e, err := s.engineOr("server not initialized")
	if err != nil {
		return nil, engine.Layout{}, req, nil, err
	}
	l, err := kvLayout(e, req)
	if err != nil {
		return nil, l, req, nil, err
	}
	chunks, err := s.chunkKeys(l, req.tokens, req.salt)
	return e, l, req, chunks, err
}

// kvLayout resolves the layout a KV request addresses. Upstream resolves a
// model name to its one registered layout; we do the same unless the client
// names a world size (X-LMCache-World-Size, or world_size in the body),
// which picks one of several (model, world_size) layouts. Our raw-object
// form (X-LMCache-Model) keeps its default of world size 1. An
// unregistered model is upstream's 400.
func kvLayout(e Engine, req kvRequest) (engine.Layout, error) {
	if req.worldSet || !req.upstream {
		l, err := e.Layout(req.model, req.worldSize)
		if errors.Is(err, engine.ErrNoLayout) || errors.Is(err, engine.ErrNotFound) {
			return l, errf(ErrBadRequest, "model_name '%s' is not registered with this engine (world_size=%d)", req.model, req.worldSize)
		}
		return l, err
	}
	var found []engine.Layout
	for _, l := range e.Layouts() {
		if l.ModelName == req.model {
			found = append(found, l)
		}
	}
	switch len(found) {
	case 0:
		return engine.Layout{}, errf(ErrBadRequest, "model_name '%s' is not registered with this engine", req.model)
	case 1:
		return found[0], nil
	}
	ws := make([]int, len(found))
	for i, l := range found {
		ws[i] = l.WorldSize
	}
	slices.Sort(ws)
	return engine.Layout{}, errf(ErrBadRequest, "model_name '%s' is registered with world sizes %v; name one with %s (or world_size in the body)", req.model, ws, HeaderWorldSize)
}

// kvGeometry is how one rank's chunk object maps into upstream's KV_2LTD
// tensor [2, num_layers, num_tokens, hidden] (all ranks' hidden slices side
// by side, all chunks along the token dim). An object is [planes, chunk,
// rowBytes]: planes is 2*num_layers (K and V of each layer), or num_layers
// for MLA, whose one latent row is not split across ranks, so the MLA
// tensor is [num_layers, num_tokens, latent] and every rank holds a copy.
type kvGeometry struct {
	planes, chunk, rowBytes int64
	world                   int
	mla                     bool
}

// tokenRow is the bytes of one token of one plane in the KV_2LTD tensor.
func (g kvGeometry) tokenRow() int64 {
	if g.mla {
		return g.rowBytes
	}
	return g.rowBytes * int64(g.world)
}

// tensorBytes is the size of the KV_2LTD tensor of n chunks.
func (g kvGeometry) tensorBytes(n int) int64 { return g.planes * int64(n) * g.chunk * g.tokenRow() }

// metaInt reads an integer the data path or --register-model put in a
// layout's Meta (int, int64 or a JSON float, depending on who wrote it).
func metaInt(m map[string]any, key string) (int64, bool) {
	v := reflect.ValueOf(m[key])
	switch {
	case !v.IsValid():
		return 0, false
	case v.CanInt():
		return v.Int(), true
	case v.CanUint():
		return int64(v.Uint()), true
	case v.CanFloat() && v.Float() == math.Trunc(v.Float()):
		return int64(v.Float()), true
	}
	return 0, false
}

// kvGeometryOf derives the KV_2LTD geometry of a registered layout from
// its number of layers and MLA flag (vLLM's registration and
// --register-model both record them) and checks it against the object
// size, so a layout the tensor form cannot describe is a clear 400 (as
// upstream's ValueError) rather than scrambled bytes.
func kvGeometryOf(l engine.Layout, chunk int) (kvGeometry, error) {
	g := kvGeometry{chunk: int64(chunk), world: l.WorldSize}
	g.mla, _ = l.Meta["use_mla"].(bool)
	if v, ok := l.Meta["is_mla"].(bool); ok {
		g.mla = g.mla || v
	}
	layers, ok := metaInt(l.Meta, "num_layers")
	if !ok || layers < 1 || len(l.GroupObjectBytes) > 1 || g.world < 1 || chunk < 1 {
		return g, errf(ErrBadRequest, "the layout registered for model_name '%s' (world_size=%d) does not record a single KV group's num_layers, so it cannot be read as a KV_2LTD tensor; use the raw-object form (%s)", l.ModelName, l.WorldSize, HeaderModel)
	}
	g.planes = layers
	if !g.mla {
		g.planes *= 2
	}
	g.rowBytes = l.ObjectBytes / (g.planes * g.chunk)
	if g.rowBytes < 1 || g.rowBytes*g.planes*g.chunk != l.ObjectBytes {
		return g, errf(ErrBadRequest, "the layout registered for model_name '%s' has %d-byte chunk objects, which is not %d planes x %d tokens x whole rows; it cannot be read as a KV_2LTD tensor", l.ModelName, l.ObjectBytes, g.planes, g.chunk)
	}
	return g, nil
}

// splitKV2LTD cuts a KV_2LTD tensor of n chunks into one object per chunk
// and rank (chunk-major, rank-minor, as the chunk keys are ordered).
func (g kvGeometry) splitKV2LTD(src []byte, n int) [][]byte {
	row, tokens := g.tokenRow(), int64(n)*g.chunk
	out := make([][]byte, 0, n*g.world)
	for c := range int64(n) {
		for r := range int64(g.world) {
			obj := make([]byte, g.planes*g.chunk*g.rowBytes)
			off := r * g.rowBytes
			if g.mla {
				off = 0
			}
			for p := range g.planes {
				for t := range g.chunk {
					s := (p*tokens+c*g.chunk+t)*row + off
					copy(obj[(p*g.chunk+t)*g.rowBytes:], src[s:s+g.rowBytes])
				}
			}
			out = append(out, obj)
		}
	}
	return out
}

// joinKV2LTD is splitKV2LTD's inverse over n chunks of objects
// (chunk-major, rank-minor); for MLA rank 0's copy is used.
func (g kvGeometry) joinKV2LTD(objs [][]byte, n int) []byte {
	row, tokens := g.tokenRow(), int64(n)*g.chunk
	dst := make([]byte, g.tensorBytes(n))
	ranks := int64(g.world)
	if g.mla {
		ranks = 1
	}
	for c := range int64(n) {
		for r := range ranks {
			obj := objs[c*int64(g.world)+r]
			for p := range g.planes {
				for t := range g.chunk {
					d := (p*tokens+c*g.chunk+t)*row + r*g.rowBytes
					copy(dst[d:d+g.rowBytes], obj[(p*g.chunk+t)*g.rowBytes:])
				}
			}
		}
	}
	return dst
}

func (s *Server) handleKVStore(w http.ResponseWriter, r *http.Request) error {
	if stream, err := storeIsStream(r); err != nil {
		return err
	} else if stream {
		return s.handleKVStoreStream(w, r)
	}
	e, l, req, chunks, err := s.kvSetup(w, r, false)
	if err != nil {
		return err
	}
	var g kvGeometry
	if req.upstream {
		if g, err = kvGeometryOf(l, s.hasher.ChunkSize()); err != nil {
			return err
		}
	}
	var keys []objkey.Key
	var sizes []int64
	var want int64
	for _, ck := range chunks {
		for _, k := range ck {
			sz := l.SizeOf(k.ObjectGroupID)
			keys = append(keys, k)
			sizes = append(sizes, sz)
			want += sz
		}
	}
	what := fmt.Sprintf("%d full chunks of this layout", len(chunks))
	if req.upstream {
		want = g.tensorBytes(len(chunks))
		what = fmt.Sprintf("a KV_2LTD tensor of %d full chunks (%d planes x %d tokens x %d bytes)", len(chunks), g.planes, int64(len(chunks))*g.chunk, g.tokenRow())
	}
	if r.ContentLength >= 0 && r.ContentLength != want {
		return errf(ErrBadRequest, "body is %d bytes; %s needs %d bytes", r.ContentLength, what, want)
	}
	if want > s.opts.MaxKVBodyBytes {
		return errf(ErrTooLarge, "store of %d bytes exceeds the %d-byte limit", want, s.opts.MaxKVBodyBytes)
	}
	// The size is known from the headers, with or without a
	// Content-Length, so the budget is taken for it before a byte is read.
	// The buffer is sized up front (plus bytes.MinRead, so ReadFrom never
	// regrows it at the end): a chunked body cannot grow it past want+1,
	// which the read's limit refuses, so the reservation is a true bound.
	release, err := s.reserve(w, "store", want)
	if err != nil {
		return err
	}
	defer release()
	var buf bytes.Buffer
	buf.Grow(int(want) + bytes.MinRead)
	if err := httproute.ReadBody(&buf, w, r, want+1, s.bodyDeadline(want+1)); err != nil {
		return err
	}
	body := buf.Bytes()
	if int64(len(body)) != want {
		return errf(ErrBadRequest, "body is %d bytes; %s needs %d bytes", len(body), what, want)
	}
	var data [][]byte
	if req.upstream {
		data = g.splitKV2LTD(body, len(chunks))
	} else {
		data = make([][]byte, len(keys))
		off := int64(0)
		for i, sz := range sizes {
			data[i] = body[off : off+sz]
			off += sz
		}
	}
	stored := 0
	if len(keys) > 0 {
		s.bindKVEvents(chunks, req)
		if stored, err = s.putKV(r, e, keys, data); err != nil {
			return err
		}
	}
	// Put is all-or-nothing (already resident objects are skipped), so on
	// success every chunk is held: upstream's stored_* count the leading
	// chunks whose objects are all in the cache.
	cs := s.hasher.ChunkSize()
	writeJSON(w, http.StatusOK, KVStoreResponse{
		Status: "ok", TotalTokens: len(chunks) * cs, TotalChunks: len(chunks), StoredTokens: len(chunks) * cs, StoredChunks: len(chunks),
		Chunks: len(chunks), Tokens: len(chunks) * cs, Keys: len(keys), Stored: stored,
	})
	return nil
}

// putKV stores the objects of a /api/kv store (both forms): Put is
// all-or-nothing, already resident objects are skipped.
func (s *Server) putKV(r *http.Request, e Engine, keys []objkey.Key, data [][]byte) (int, error) {
	return e.PutContext(r.Context(), keys, data)
}

// kvProbe runs a read-locking lookup over chunks and returns the result; the
// caller releases the locks of the prefix with release.
func (s *Server) kvProbe(r *http.Request, e Engine, chunks [][]objkey.Key) (engine.PrefetchResult, func(), error) {
	id := "kvapi-" + newRequestID()
	if err := e.Prefetch(engine.PrefetchRequest{ID: id, Chunks: chunks, Readers: 1, Trace: trace.SpanContextFromContext(r.Context())}); err != nil {
		return engine.PrefetchResult{}, nil, err
	}
	res, err := e.WaitPrefetch(r.Context(), id)
	if err != nil {
		// The client went away (the request's context is all that ends
		// this wait) while the job still runs: it already holds its L1
		// hits' read locks and takes the prefix's when it ends, for an
		// owner nobody else knows. Returning alone left them pinned until
		// the read lease expired, so the release waits for the job off
		// the handler (which frees the connection slot).
		s.releaseWhenDone(e, id, chunks)
		return res, nil, err
	}
	return res, func() { releasePrefix(e, id, chunks, res.PrefixChunks) }, res.Err
}

// releasePrefix releases the read locks a probe's job holds for owner id:
// one per key of its first prefix chunks.
func releasePrefix(e Engine, id string, chunks [][]objkey.Key, prefix int) {
	var ks []objkey.Key
	for _, ck := range chunks[:min(max(prefix, 0), len(chunks))] {
		ks = append(ks, ck...)
	}
	if len(ks) > 0 {
		e.ReleaseRead(id, ks, 1)
	}
}

// releaseWhenDone waits, in the background, for an abandoned probe's job
// and releases its locks. The wait ends with the job (the engine finishes
// every job, at the latest when it stops) or when Serve stops.
func (s *Server) releaseWhenDone(e Engine, id string, chunks [][]objkey.Key) {
	s.log.Debug("KV request's client went away during its lookup; its locks are released when the job ends", "request_id", id)
	s.bgWG.Add(1)
	go func() {
		defer s.bgWG.Done()
		res, err := e.WaitPrefetch(s.bg, id)
		if err != nil {
			return
		}
		releasePrefix(e, id, chunks, res.PrefixChunks)
	}()
}

func (s *Server) recordLookup(req kvRequest, chunks int, res engine.PrefetchResult) {
	s.metrics.RecordLookup(req.model, req.salt, s.hasher.ChunkSize(), chunks,
		mpmetrics.LookupResult{PrefixChunks: res.PrefixChunks, L1Keys: res.L1Keys, L2Keys: res.L2Keys, Duration: res.Duration})
}

func setHitHeaders(h http.Header, res engine.PrefetchResult, prefix, total, chunkSize int) {
	h.Set(HeaderHitChunks, strconv.Itoa(prefix))
	h.Set(HeaderHitTokens, strconv.Itoa(prefix*chunkSize))
	h.Set(HeaderTotalChunks, strconv.Itoa(total))
	h.Set(HeaderTotalTokens, strconv.Itoa(total*chunkSize))
	h.Set(HeaderL1Keys, strconv.Itoa(res.L1Keys))
	h.Set(HeaderL2Keys, strconv.Itoa(res.L2Keys))
}

// kvMiss answers a retrieve that found nothing: upstream's form gets its
// 404 with an empty body, the hit headers and the KV media type; ours a
// 404 with a JSON detail.
func kvMiss(w http.ResponseWriter, req kvRequest, msg string) error {
	if !req.upstream {
		return errf(ErrNotFound, "%s", msg)
	}
	w.Header().Set("Content-Type", ContentTypeKV)
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusNotFound)
	return nil
}

// retrieveWantsStream picks the framed answer of newer upstream: the
// client accepts application/x-lmcache-kv-stream or its JSON body names a
// protocol_version (upstream's SDK sends both). Only version 1 exists.
func retrieveWantsStream(r *http.Request, req kvRequest) (bool, error) {
	if req.protocol != 0 && req.protocol != kvProtocolVersion {
		return true, errf(ErrBadRequest, "unsupported KV protocol version %d; expected %d", req.protocol, kvProtocolVersion)
	}
	if req.protocol == kvProtocolVersion {
		return true, nil
	}
	return isKVStream(r.Header.Get("Accept"))
}

func (s *Server) handleKVRetrieve(w http.ResponseWriter, r *http.Request) error {
	e, l, req, chunks, err := s.kvSetup(w, r, true)
	if err != nil {
		return err
	}
	stream, err := retrieveWantsStream(r, req)
	if err != nil {
		return err
	}
	var g kvGeometry
	var sg kvShard
	switch {
	case stream && len(chunks) > 0:
		if sg, err = kvShardOf(l, s.hasher.ChunkSize()); err != nil {
			return err
		}
	case req.upstream && !stream:
		if g, err = kvGeometryOf(l, s.hasher.ChunkSize()); err != nil {
			return err
		}
	}
	if len(chunks) == 0 {
		setHitHeaders(w.Header(), engine.PrefetchResult{}, 0, 0, s.hasher.ChunkSize())
		if stream {
			s.retrieveStream(w, l, req, 0, kvShard{}, nil, 0)
			return nil
		}
		return kvMiss(w, req, fmt.Sprintf("no cached prefix: fewer tokens than one chunk (%d)", s.hasher.ChunkSize()))
	}
	res, release, err := s.kvProbe(r, e, chunks)
	if release != nil {
		defer release()
	}
	if err != nil {
		return err
	}
	prefix := min(res.PrefixChunks, len(chunks))
	// The answer is buffered (Get copies the objects out of L1, and the
	// tensor and raw forms join them into one more buffer), so it takes
	// the KV budget before the copy: a prefix larger than the whole budget
	// is cut to the longest one that fits (a shorter prefix is still a
	// correct answer; the hit headers count what is returned), and one
	// the budget cannot hold now is 503 with Retry-After.
	if prefix > 0 {
		perChunk := int64(0)
		for _, k := range chunks[0] {
			perChunk += l.SizeOf(k.ObjectGroupID)
		}
		if !stream {
			perChunk *= 2
		}
		if perChunk > 0 {
			// At least one chunk is asked for: one larger than the
			// whole budget is the 413 of reserve, not a miss.
			prefix = int(max(1, min(int64(prefix), s.budget.size/perChunk)))
		}
		release, err := s.reserve(w, "retrieve", int64(prefix)*perChunk)
		if err != nil {
			return err
		}
		defer release()
	}
	var keys []objkey.Key
	for _, ck := range chunks[:prefix] {
		keys = append(keys, ck...)
	}
	var objs [][]byte
	if len(keys) > 0 {
		if objs, err = e.Get(keys); err != nil {
			return err
		}
	}
	// Trust only what was actually copied out: stop at the first chunk with
	// a missing object.
	got := 0
	for c := 0; c < prefix; c++ {
		n := len(chunks[c])
		complete := true
		for _, o := range objs[c*n : (c+1)*n] {
			if o == nil {
				complete = false
				break
			}
		}
		if !complete {
			break
		}
		got++
	}
	res.PrefixChunks = got
	s.recordLookup(req, len(chunks), res)
	setHitHeaders(w.Header(), res, got, len(chunks), s.hasher.ChunkSize())
	if stream {
		s.retrieveStream(w, l, req, len(chunks), sg, objs, got)
		return nil
	}
	if got == 0 {
		return kvMiss(w, req, "no cached prefix for these tokens")
	}
	var out []byte
	if req.upstream {
		out = g.joinKV2LTD(objs, got)
		w.Header().Set("Content-Type", ContentTypeKV)
	} else {
		n := 0
		for _, o := range objs[:got*len(chunks[0])] {
			n += len(o)
		}
		out = make([]byte, 0, n) // one allocation, as the budget counted
		for _, o := range objs[:got*len(chunks[0])] {
			out = append(out, o...)
		}
		w.Header().Set("Content-Type", ctBinary)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	return nil
}

func (s *Server) handleKVLookup(w http.ResponseWriter, r *http.Request) error {
	e, _, req, chunks, err := s.kvSetup(w, r, true)
	if err != nil {
		return err
	}
	var res engine.PrefetchResult
	if len(chunks) > 0 {
		var release func()
		res, release, err = s.kvProbe(r, e, chunks)
		if release != nil {
			release()
		}
		if err != nil {
			return err
		}
	}
	prefix := min(res.PrefixChunks, len(chunks))
	s.recordLookup(req, len(chunks), res)
	setHitHeaders(w.Header(), res, prefix, len(chunks), s.hasher.ChunkSize())
	cs := s.hasher.ChunkSize()
	writeJSON(w, http.StatusOK, KVLookupResponse{
		HitChunks: prefix, HitTokens: prefix * cs, TotalChunks: len(chunks), TotalTokens: len(chunks) * cs,
		L1Keys: res.L1Keys, L2Keys: res.L2Keys,
	})
	return nil
}
