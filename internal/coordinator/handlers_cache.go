package coordinator

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"

	gojson "github.com/goccy/go-json"

	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/coordinator/mpclient"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// maxTokenIDs is upstream's per-request cap on token_ids.
const maxTokenIDs = 1_000_000

// maxPinKeys bounds chunks × world_size so one request cannot allocate
// unbounded memory (upstream has no bound).
const maxPinKeys = 4_000_000

// tokenRequest is the shared body of prefetch and pin requests.
type tokenRequest struct {
	InstanceID *string `json:"instance_id"`
	ModelName  *string `json:"model_name"`
	WorldSize  *int64  `json:"world_size"`
	TokenIDs   []int64 `json:"token_ids"`
	CacheSalt  *string `json:"cache_salt"`
}

// parseTokenRequest decodes a prefetch or pin body: a typed fast decode
// (1M-token lists), then the generic validator for anything it refuses.
func parseTokenRequest(w http.ResponseWriter, r *http.Request, needInstance bool) (tokenRequest, error) {
	body, err := readBody(w, r, tokenBodyLimit)
	if err != nil {
		return tokenRequest{}, err
	}
	var t tokenRequest
	if jsonContentType(r) && gojson.UnmarshalNoEscape(body, &t) == nil && t.ModelName != nil && t.WorldSize != nil && (!needInstance || t.InstanceID != nil) &&
		len(*t.ModelName) <= ledger.MaxModelNameBytes && (t.InstanceID == nil || len(*t.InstanceID) <= maxInstanceIDBytes) {
		if *t.WorldSize < 1 {
			return t, invalid(detailItem{Type: "greater_than_equal", Loc: []any{"body", "world_size"}, Msg: "Input should be greater than or equal to 1", Input: *t.WorldSize, Ctx: map[string]any{"ge": 1}})
		}
		if t.CacheSalt == nil {
			empty := ""
			t.CacheSalt = &empty
		}
		return t, nil
	}
	f, err := parseObject(r, body)
	if err != nil {
		return t, err
	}
	var id string
	if needInstance {
		id = f.str("instance_id", true, "")
		f.tooLong("instance_id", id, maxInstanceIDBytes)
	}
	model := f.str("model_name", true, "")
	f.tooLong("model_name", model, ledger.MaxModelNameBytes)
	// No upper bound, as upstream and the typed path above: pins bound
	// chunks × world_size themselves.
	ws := f.intRange("world_size", true, 1, 1, math.MaxInt64)
	toks := f.intList("token_ids")
	salt := f.str("cache_salt", false, "")
	if err := f.err(); err != nil {
		return t, err
	}
	return tokenRequest{InstanceID: &id, ModelName: &model, WorldSize: &ws, TokenIDs: toks, CacheSalt: &salt}, nil
}

type prefetchResponse struct {
	InstanceID string `json:"instance_id"`
	RequestID  string `json:"request_id"`
	Chunks     int    `json:"chunks"`
	Status     string `json:"status"`
}

type pinResponse struct {
	Requested int    `json:"requested"`
	Affected  int    `json:"affected"`
	Status    string `json:"status"`
}

func noInstance(id string) error {
	return withMsg(ErrNotFound, "no MP server registered with instance_id='%s'", id)
}

func (s *Server) handlePrefetch(w http.ResponseWriter, r *http.Request) error {
	t, err := parseTokenRequest(w, r, true)
	if err != nil {
		return err
	}
	id := *t.InstanceID
	inst, ok := s.reg.Get(id)
	if !ok {
		return noInstance(id)
	}
	toks := t.TokenIDs
	if toks == nil {
		toks = []int64{}
	}
	reply, err := s.mp.SubmitPrefetch(r.Context(), mpclient.BaseURL(inst.IP, inst.HTTPPort), mpclient.PrefetchRequest{
		ModelName: *t.ModelName, WorldSize: int(*t.WorldSize), TokenIDs: toks, CacheSalt: *t.CacheSalt,
	})
	if err != nil {
		s.log.Warn("prefetch submit failed", "instance_id", id, "err", s.scrub(err))
		// The body's copy of the reply is scrubbed by the route table's
		// onError, as every error body is.
		return withMsg(ErrUpstream, "prefetch submit to '%s' failed: %v", id, err)
	}
	out := prefetchResponse{InstanceID: id, Status: "submitted"}
	if reply.RequestID != nil {
		out.RequestID = *reply.RequestID
	}
	if reply.Chunks != nil {
		out.Chunks = *reply.Chunks
	}
	if reply.Status != nil && *reply.Status != "" {
		out.Status = *reply.Status
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handlePrefetchStatus(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("instance_id")
	inst, ok := s.reg.Get(id)
	if !ok {
		return noInstance(id)
	}
	code, body, err := s.mp.PrefetchStatus(r.Context(), mpclient.BaseURL(inst.IP, inst.HTTPPort), r.PathValue("request_id"))
	if err != nil {
		return withMsg(ErrUpstream, "prefetch status from '%s' failed: %v", id, err)
	}
	// Relay the server's status and body verbatim (but for the configured
	// tokens, should a server ever echo one); a non-JSON body is wrapped
	// the way upstream does.
	body = []byte(s.scrubText(string(body)))
	if !json.Valid(body) {
		writeJSON(w, code, map[string]string{"detail": string(body)})
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
	return nil
}

func (s *Server) handlePin(w http.ResponseWriter, r *http.Request) error {
	return s.pinOrUnpin(w, r, 1, "pinned")
}

func (s *Server) handleUnpin(w http.ResponseWriter, r *http.Request) error {
	return s.pinOrUnpin(w, r, -1, "unpinned")
}

// pinOrUnpin resolves token ids to object keys locally (same hashing and
// rank fan-out as the MP servers) and adjusts their pin counts.
func (s *Server) pinOrUnpin(w http.ResponseWriter, r *http.Request, delta int32, status string) error {
	t, err := parseTokenRequest(w, r, false)
	if err != nil {
		return err
	}
	if n := len(t.TokenIDs); n > maxTokenIDs {
		return badRequest("too many token_ids in a single request (limit=%d, got=%d)", maxTokenIDs, n)
	}
	// The salt is checked before hashing, as upstream does.
	if err := objkey.ValidateSalt(*t.CacheSalt); err != nil {
		return badRequest("%s", objkey.Reason(err))
	}
	chunks := s.hasher.NumChunks(len(t.TokenIDs))
	if chunks == 0 {
		writeJSON(w, http.StatusOK, pinResponse{0, 0, status})
		return nil
	}
	if ws := *t.WorldSize; ws > maxPinKeys || int64(chunks)*ws > maxPinKeys {
		return badRequest("request resolves to %d keys (limit=%d); split it", int64(chunks)*(*t.WorldSize), maxPinKeys)
	}
	hashes, err := s.hasher.ChunkHashes(t.TokenIDs[:chunks*s.hasher.ChunkSize()])
	if err != nil {
		if errors.Is(err, tokenhash.ErrTokenRange) {
			return badRequest("token_ids must be in 0..4294967295: %v", err)
		}
		return err
	}
	groups, err := objkey.FanOut(hashes, *t.ModelName, int(*t.WorldSize), -1, []int64{0}, *t.CacheSalt)
	if err != nil {
		return badRequest("%s", objkey.Reason(err))
	}
	keys := groups[0]
	if err := s.pin(r.Context(), *t.ModelName, *t.WorldSize, *t.CacheSalt, hashes, keys, delta); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, pinResponse{len(hashes), len(keys), status})
	return nil
}
