package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Body limits. A DELETE of 10,000 keys is about 2.5 MB of JSON.
const (
	maxJSONBody    = 16 << 20
	maxSmallBody   = 1 << 20
	maxDeleteKeys  = 10_000
	maxPrefetchTok = 1_000_000
	defaultPage    = 500
	maxPage        = 5000
)

// Body read deadline: Options.BodyReadTimeout (default 30 s) per started
// 16 MiB the route allows (a 1 GiB KV store gets 64 of them, 32 min), so
// a client trickling a body cannot hold a connection (one of httplimit's
// capped slots) for ever.
const (
	defaultBodyReadTimeout = 30 * time.Second
	bodyReadUnit           = 16 << 20
)

// bodyDeadline is the time a client has to send a body of up to limit
// bytes: Options.BodyReadTimeout per started bodyReadUnit.
func (s *Server) bodyDeadline(limit int64) time.Duration {
	return httproute.ScaledDeadline(s.opts.BodyReadTimeout, bodyReadUnit, limit)
}

// readBody reads at most limit bytes of r's body, within a deadline that
// grows with limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	// Not every ResponseWriter supports deadlines (httptest recorders);
	// then only the size bound applies.
	var buf bytes.Buffer
	if err := httproute.ReadBody(&buf, w, r, limit, s.bodyDeadline(limit)); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeStrict unmarshals exactly one JSON value into v, mapping failures
// to FastAPI-style 422s. Unknown fields are ignored, as upstream's request
// models do; a route that forbids them (DAX reconfigure) decodes to a map
// and reports extra_forbidden per key itself, since encoding/json's
// DisallowUnknownFields error has no type or sentinel to tell it apart
// but its message text.
func decodeStrict(body []byte, v any) error {
	switch err := httproute.DecodeJSON(body, v); {
	case errors.Is(err, httproute.ErrTrailingJSON):
		return invalid("json_invalid", "JSON decode error: trailing data after the JSON value", "body")
	case err != nil:
		return jsonErr(err)
	}
	return nil
}

func jsonErr(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		loc := []any{"body"}
		for _, p := range strings.Split(te.Field, ".") {
			if p != "" {
				loc = append(loc, p)
			}
		}
		return &validationError{items: []fieldError{{Loc: loc, Msg: fmt.Sprintf("Input should be a valid %s", pyType(te.Type.String())), Type: pyType(te.Type.String()) + "_type"}}}
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return invalid("json_invalid", "JSON decode error: "+err.Error(), "body")
	}
	return invalid("value_error", err.Error(), "body")
}

func pyType(goType string) string {
	switch {
	case strings.Contains(goType, "int"):
		return "int"
	case strings.Contains(goType, "float"), goType == "json.Number":
		return "number"
	case strings.Contains(goType, "bool"):
		return "bool"
	case strings.Contains(goType, "string"):
		return "string"
	case strings.HasPrefix(goType, "[]"), strings.HasPrefix(goType, "*[]"):
		return "list"
	}
	return "dict"
}

func missing(loc ...any) error { return invalid("missing", "Field required", loc...) }

// keyIn is EncodedObjectKey as received: object_group_id and cache_salt are
// optional for payloads from older servers.
type keyIn struct {
	ChunkHashHex  *string `json:"chunk_hash_hex"`
	ModelName     *string `json:"model_name"`
	KVRank        *int64  `json:"kv_rank"`
	ObjectGroupID *int64  `json:"object_group_id"`
	CacheSalt     *string `json:"cache_salt"`
}

func (k keyIn) shapeCheck(i int) error {
	switch {
	case k.ChunkHashHex == nil:
		return missing("body", "keys", i, "chunk_hash_hex")
	case k.ModelName == nil:
		return missing("body", "keys", i, "model_name")
	case k.KVRank == nil:
		return missing("body", "keys", i, "kv_rank")
	}
	return nil
}

func (k keyIn) encoded() objkey.Encoded {
	e := objkey.Encoded{ChunkHashHex: *k.ChunkHashHex, ModelName: *k.ModelName, KVRank: *k.KVRank}
	if k.ObjectGroupID != nil {
		e.ObjectGroupID = *k.ObjectGroupID
	}
	if k.CacheSalt != nil {
		e.CacheSalt = *k.CacheSalt
	}
	return e
}

// deleteObjectsReq is the DELETE /cache/objects body after validation.
type deleteObjectsReq struct {
	Keys    []objkey.Key
	Tier    string
	Force   bool
	Adapter string // "" = primary
}

// decodeDeleteObjects validates the shape (422), the batch cap and every key
// (400 naming keys[i]) before anything is deleted.
func decodeDeleteObjects(body []byte) (deleteObjectsReq, error) {
	var in struct {
		Keys    *[]keyIn `json:"keys"`
		Tier    *string  `json:"tier"`
		Force   *bool    `json:"force"`
		Adapter *string  `json:"adapter"`
	}
	if err := decodeStrict(body, &in); err != nil {
		return deleteObjectsReq{}, err
	}
	if in.Keys == nil {
		return deleteObjectsReq{}, missing("body", "keys")
	}
	out := deleteObjectsReq{Tier: "l2"}
	if in.Tier != nil {
		switch *in.Tier {
		case "l1", "l2", "all":
			out.Tier = *in.Tier
		default:
			return deleteObjectsReq{}, invalid("enum", "Input should be 'l1', 'l2' or 'all'", "body", "tier")
		}
	}
	if in.Force != nil {
		out.Force = *in.Force
	}
	if in.Adapter != nil {
		out.Adapter = *in.Adapter
	}
	for i, k := range *in.Keys {
		if err := k.shapeCheck(i); err != nil {
			return deleteObjectsReq{}, err
		}
	}
	if n := len(*in.Keys); n > maxDeleteKeys {
		return deleteObjectsReq{}, errf(ErrBadRequest, "too many keys in a single request (limit=%d, got=%d)", maxDeleteKeys, n)
	}
	out.Keys = make([]objkey.Key, 0, len(*in.Keys))
	for i, k := range *in.Keys {
		key, err := k.encoded().Decode()
		if err != nil {
			return deleteObjectsReq{}, errf(ErrBadRequest, "keys[%d]: %v", i, err)
		}
		out.Keys = append(out.Keys, key)
	}
	return out, nil
}

// prefetchReq is the POST /cache/prefetches body.
type prefetchReq struct {
	ModelName string
	WorldSize int
	TokenIDs  []int64
	CacheSalt string
}

func decodePrefetch(body []byte) (prefetchReq, error) {
	var in struct {
		ModelName  *string  `json:"model_name"`
		WorldSize  *int     `json:"world_size"`
		TokenIDs   *[]int64 `json:"token_ids"`
		CacheSalt  *string  `json:"cache_salt"`
		SourceTier *string  `json:"source_tier"`
		TargetTier *string  `json:"target_tier"`
	}
	if err := decodeStrict(body, &in); err != nil {
		return prefetchReq{}, err
	}
	switch {
	case in.ModelName == nil:
		return prefetchReq{}, missing("body", "model_name")
	case in.WorldSize == nil:
		return prefetchReq{}, missing("body", "world_size")
	case *in.WorldSize < 1:
		return prefetchReq{}, invalid("greater_than_equal", "Input should be greater than or equal to 1", "body", "world_size")
	}
	src, dst := "l2", "l1"
	if in.SourceTier != nil {
		src = *in.SourceTier
	}
	if in.TargetTier != nil {
		dst = *in.TargetTier
	}
	for _, t := range []struct{ v, f string }{{src, "source_tier"}, {dst, "target_tier"}} {
		if t.v != "l1" && t.v != "l2" && t.v != "all" {
			return prefetchReq{}, invalid("enum", "Input should be 'l1', 'l2' or 'all'", "body", t.f)
		}
	}
	if src != "l2" || dst != "l1" {
		return prefetchReq{}, errf(ErrBadRequest, "unsupported prefetch direction '%s'->'%s'; only 'l2'->'l1'", src, dst)
	}
	out := prefetchReq{ModelName: *in.ModelName, WorldSize: *in.WorldSize}
	if in.TokenIDs != nil {
		out.TokenIDs = *in.TokenIDs
	}
	if in.CacheSalt != nil {
		out.CacheSalt = *in.CacheSalt
	}
	if len(out.TokenIDs) > maxPrefetchTok {
		return prefetchReq{}, errf(ErrBadRequest, "token_ids exceeds the per-request cap (limit=%d, got=%d)", maxPrefetchTok, len(out.TokenIDs))
	}
	if err := objkey.ValidateSalt(out.CacheSalt); err != nil {
		return prefetchReq{}, errf(ErrBadRequest, "%v", err)
	}
	return out, nil
}

// clearReq is the POST /cache/clear body; an empty body means defaults.
func decodeClear(body []byte) (tier string, force bool, err error) {
	tier, force = "l1", true
	if len(bytes.TrimSpace(body)) == 0 {
		return tier, force, nil
	}
	var in struct {
		Tier  *string `json:"tier"`
		Force *bool   `json:"force"`
	}
	if err := decodeStrict(body, &in); err != nil {
		return "", false, err
	}
	if in.Force != nil {
		force = *in.Force
	}
	if in.Tier != nil {
		switch *in.Tier {
		case "l1":
		case "l2", "all":
			return "", false, errf(ErrBadRequest, "tier '%s' not supported; only 'l1'", *in.Tier)
		default:
			return "", false, invalid("enum", "Input should be 'l1', 'l2' or 'all'", "body", "tier")
		}
	}
	return tier, force, nil
}

// checksumReq is the POST /cache/checksums body.
type checksumReq struct {
	BlockIDs   []int
	ChunkSize  int
	InstanceID int
	Layerwise  bool
}

// decodeChecksums checks shape only; the 400s for empty block_ids and a
// non-positive chunk_size come after the 501/404 checks, as upstream.
func decodeChecksums(body []byte) (checksumReq, bool, error) {
	var in struct {
		BlockIDs   *[]int `json:"block_ids"`
		ChunkSize  *int   `json:"chunk_size"`
		InstanceID *int   `json:"instance_id"`
		Layerwise  *bool  `json:"layerwise"`
	}
	if err := decodeStrict(body, &in); err != nil {
		return checksumReq{}, false, err
	}
	var out checksumReq
	if in.BlockIDs != nil {
		out.BlockIDs = *in.BlockIDs
	}
	hasChunk := in.ChunkSize != nil
	if hasChunk {
		out.ChunkSize = *in.ChunkSize
	}
	if in.InstanceID != nil {
		out.InstanceID = *in.InstanceID
	}
	if in.Layerwise != nil {
		out.Layerwise = *in.Layerwise
	}
	return out, hasChunk, nil
}

// decodeQuotaPut applies upstream's PUT /quota rules: the value goes through
// Python float() semantics (numbers and numeric strings; booleans are
// refused, unlike upstream), must be
// finite and non-negative. Errors are 400s with the {"error"} shape.
func decodeQuotaPut(body []byte) (float64, error) {
	var raw any
	if err := httproute.DecodeJSON(body, &raw); err != nil {
		return 0, errf(ErrBadRequest, "invalid JSON body")
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return 0, errf(ErrBadRequest, "body must be {'limit_gb': <float>}")
	}
	v, ok := obj["limit_gb"]
	if !ok {
		return 0, errf(ErrBadRequest, "body must be {'limit_gb': <float>}")
	}
	// Deviation: Python's float(True) is 1.0, so upstream stores a 1 GB
	// quota for {"limit_gb": true}. A boolean is not a number here.
	if _, isBool := v.(bool); isBool {
		return 0, errf(ErrBadRequest, "limit_gb must be numeric")
	}
	f, ok := pyFloat(v)
	if !ok {
		return 0, errf(ErrBadRequest, "limit_gb must be numeric")
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errf(ErrBadRequest, "limit_gb must be finite")
	}
	if f < 0 {
		return 0, errf(ErrBadRequest, "limit_gb must be non-negative")
	}
	// -0.0 passes the sign check; store and echo it as 0 like every other
	// zero (Go would print "-0").
	if f == 0 {
		f = 0
	}
	return f, nil
}

func pyFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(x.String(), 64)
		if err != nil {
			// Python's json turns 1e400 into inf, which the finite check
			// then rejects.
			var ne *strconv.NumError
			if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
				return f, true
			}
			return 0, false
		}
		return f, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case string:
		s := strings.TrimSpace(x)
		if s == "" || strings.HasPrefix(strings.ToLower(strings.TrimLeft(s, "+-")), "0x") {
			return 0, false
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			var ne *strconv.NumError
			if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
				return f, true // Python float('1e999') is inf; the finite check rejects it
			}
			return 0, false
		}
		return f, true
	}
	return 0, false
}

// parseTokens parses the X-LMCache-Tokens header: a JSON array of ints or a
// comma/space separated list. Every id must fit in uint32 (the hasher's
// domain); the count is capped like prefetch.
func parseTokens(h string) ([]int64, error) {
	s := strings.TrimSpace(h)
	if s == "" {
		return nil, errf(ErrBadRequest, "X-LMCache-Tokens is required")
	}
	var toks []int64
	if strings.HasPrefix(s, "[") {
		if err := json.Unmarshal([]byte(s), &toks); err != nil {
			return nil, errf(ErrBadRequest, "X-LMCache-Tokens: invalid JSON array of ints: %v", err)
		}
	} else {
		fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
		if len(fields) > maxPrefetchTok {
			return nil, errf(ErrBadRequest, "X-LMCache-Tokens: too many tokens (limit=%d)", maxPrefetchTok)
		}
		toks = make([]int64, 0, len(fields))
		for i, f := range fields {
			v, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return nil, errf(ErrBadRequest, "X-LMCache-Tokens[%d]: %q is not an integer", i, f)
			}
			toks = append(toks, v)
		}
	}
	if err := checkTokens(toks, HeaderTokens); err != nil {
		return nil, err
	}
	return toks, nil
}

// checkTokens applies the token cap and the hasher's uint32 domain; label
// names the field in the message.
func checkTokens(toks []int64, label string) error {
	if len(toks) > maxPrefetchTok {
		return errf(ErrBadRequest, "%s: too many tokens (limit=%d)", label, maxPrefetchTok)
	}
	for i, t := range toks {
		if t < 0 || t > math.MaxUint32 {
			return errf(ErrBadRequest, "%s[%d]=%d is outside the uint32 range", label, i, t)
		}
	}
	return nil
}
