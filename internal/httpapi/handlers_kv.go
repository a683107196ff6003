package httpapi

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Headers of the bytes-level KV API.
const (
	HeaderModel       = "X-LMCache-Model"
	HeaderTokens      = "X-LMCache-Tokens"
	HeaderCacheSalt   = "X-LMCache-Cache-Salt"
	HeaderWorldSize   = "X-LMCache-World-Size"
	HeaderHitChunks   = "X-LMCache-Hit-Chunks"
	HeaderHitTokens   = "X-LMCache-Hit-Tokens"
	HeaderTotalChunks = "X-LMCache-Total-Chunks"
	HeaderL1Keys      = "X-LMCache-L1-Keys"
	HeaderL2Keys      = "X-LMCache-L2-Keys"
)

// kvRequest is the parsed header set of a /api/kv/* call.
type kvRequest struct {
	model     string
	worldSize int
	salt      string
	tokens    []int64
}

func parseKVHeaders(h http.Header) (kvRequest, error) {
	req := kvRequest{model: h.Get(HeaderModel), salt: h.Get(HeaderCacheSalt), worldSize: 1}
	if req.model == "" {
		return req, errf(ErrBadRequest, "%s is required", HeaderModel)
	}
	if strings.Contains(req.model, "@") {
		return req, errf(ErrBadRequest, "%s must not contain '@'", HeaderModel)
	}
	if v := h.Get(HeaderWorldSize); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > 255 {
			return req, errf(ErrBadRequest, "%s must be an integer in [1, 255] (got %q)", HeaderWorldSize, v)
		}
		req.worldSize = n
	}
	if err := objkey.ValidateSalt(req.salt); err != nil {
		return req, errf(ErrBadRequest, "%s: %v", HeaderCacheSalt, err)
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
// "world_size", default 1; other fields such as protocol_version are
// ignored). Shape errors are 422; bad values get the header form's 400s.
func decodeKVBody(body []byte) (kvRequest, error) {
	var in struct {
		ModelName *string  `json:"model_name"`
		Tokens    *[]int64 `json:"tokens"`
		CacheSalt *string  `json:"cache_salt"`
		WorldSize *int     `json:"world_size"`
	}
	if err := decodeStrict(body, &in, false); err != nil {
		return kvRequest{}, err
	}
	switch {
	case in.ModelName == nil:
		return kvRequest{}, missing("body", "model_name")
	case in.Tokens == nil:
		return kvRequest{}, missing("body", "tokens")
	}
	req := kvRequest{model: *in.ModelName, tokens: *in.Tokens, worldSize: 1}
	if in.CacheSalt != nil {
		req.salt = *in.CacheSalt
	}
	if in.WorldSize != nil {
		if *in.WorldSize < 1 || *in.WorldSize > 255 {
			return req, invalid("less_than_equal", "Input should be between 1 and 255", "body", "world_size")
		}
		req.worldSize = *in.WorldSize
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
	l, err := s.layoutFor(e, req.model, req.worldSize)
	if err != nil {
		return nil, l, req, nil, err
	}
	chunks, err := s.chunkKeys(l, req.tokens, req.salt)
	return e, l, req, chunks, err
}

func (s *Server) handleKVStore(w http.ResponseWriter, r *http.Request) error {
	e, l, _, chunks, err := s.kvSetup(w, r, false)
	if err != nil {
		return err
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
	if r.ContentLength >= 0 && r.ContentLength != want {
		return errf(ErrBadRequest, "body is %d bytes; %d full chunks of this layout need %d bytes", r.ContentLength, len(chunks), want)
	}
	if want > s.opts.MaxKVBodyBytes {
		return errf(ErrTooLarge, "store of %d bytes exceeds the %d-byte limit", want, s.opts.MaxKVBodyBytes)
	}
	body, err := s.readBody(w, r, want+1)
	if err != nil {
		return err
	}
	if int64(len(body)) != want {
		return errf(ErrBadRequest, "body is %d bytes; %d full chunks of this layout need %d bytes", len(body), len(chunks), want)
	}
	data := make([][]byte, len(keys))
	off := int64(0)
	for i, sz := range sizes {
		data[i] = body[off : off+sz]
		off += sz
	}
	stored := 0
	if len(keys) > 0 {
		if stored, err = e.Put(keys, data); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, KVStoreResponse{
		Chunks: len(chunks), Tokens: len(chunks) * s.hasher.ChunkSize(), Keys: len(keys), Stored: stored,
	})
	return nil
}

// kvProbe runs a read-locking lookup over chunks and returns the result; the
// caller releases the locks of the prefix with release.
func (s *Server) kvProbe(r *http.Request, e Engine, chunks [][]objkey.Key) (engine.PrefetchResult, func(), error) {
	id := "kvapi-" + newRequestID()
	if err := e.Prefetch(engine.PrefetchRequest{ID: id, Chunks: chunks, Readers: 1}); err != nil {
		return engine.PrefetchResult{}, nil, err
	}
	res, err := e.WaitPrefetch(r.Context(), id)
	if err != nil {
		return res, nil, err
	}
	release := func() {
		var ks []objkey.Key
		for _, ck := range chunks[:min(res.PrefixChunks, len(chunks))] {
			ks = append(ks, ck...)
		}
		if len(ks) > 0 {
			e.ReleaseRead(id, ks, 1)
		}
	}
	return res, release, res.Err
}

func (s *Server) recordLookup(req kvRequest, chunks int, res engine.PrefetchResult) {
	s.metrics.RecordLookup(req.model, req.salt, s.hasher.ChunkSize(), chunks,
		mpmetrics.LookupResult{PrefixChunks: res.PrefixChunks, L1Keys: res.L1Keys, L2Keys: res.L2Keys})
}

func setHitHeaders(h http.Header, res engine.PrefetchResult, prefix, total, chunkSize int) {
	h.Set(HeaderHitChunks, strconv.Itoa(prefix))
	h.Set(HeaderHitTokens, strconv.Itoa(prefix*chunkSize))
	h.Set(HeaderTotalChunks, strconv.Itoa(total))
	h.Set(HeaderL1Keys, strconv.Itoa(res.L1Keys))
	h.Set(HeaderL2Keys, strconv.Itoa(res.L2Keys))
}

func (s *Server) handleKVRetrieve(w http.ResponseWriter, r *http.Request) error {
	e, _, req, chunks, err := s.kvSetup(w, r, true)
	if err != nil {
		return err
	}
	if len(chunks) == 0 {
		return errf(ErrNotFound, "no cached prefix: fewer tokens than one chunk (%d)", s.hasher.ChunkSize())
	}
	res, release, err := s.kvProbe(r, e, chunks)
	if release != nil {
		defer release()
	}
	if err != nil {
		return err
	}
	prefix := min(res.PrefixChunks, len(chunks))
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
	var out []byte
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
		for _, o := range objs[c*n : (c+1)*n] {
			out = append(out, o...)
		}
		got++
	}
	res.PrefixChunks = got
	s.recordLookup(req, len(chunks), res)
	setHitHeaders(w.Header(), res, got, len(chunks), s.hasher.ChunkSize())
	if got == 0 {
		return errf(ErrNotFound, "no cached prefix for these tokens")
	}
	w.Header().Set("Content-Type", ctBinary)
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
