package httpapi

import (
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func (s *Server) handleListObjects(w http.ResponseWriter, r *http.Request) error {
	q := httproute.Query(r)
	if t := q.Get("tier"); q.Has("tier") && t != "l2" {
		if t == "l1" || t == "all" {
			return errf(ErrBadRequest, "tier '%s' not supported; only 'l2'", t)
		}
		return invalid("enum", "Input should be 'l1', 'l2' or 'all'", "query", "tier")
	}
	pageSize := defaultPage
	if q.Has("page_size") {
		n, err := strconv.Atoi(strings.TrimSpace(q.Get("page_size")))
		if err != nil {
			return invalid("int_parsing", "Input should be a valid integer, unable to parse string as an integer", "query", "page_size")
		}
		if n < 1 {
			return invalid("greater_than_equal", "Input should be greater than or equal to 1", "query", "page_size")
		}
		if n > maxPage {
			return invalid("less_than_equal", fmt.Sprintf("Input should be less than or equal to %d", maxPage), "query", "page_size")
		}
		pageSize = n
	}
	e, err := s.engineOr("server not initialized")
	if err != nil {
		return err
	}
	a, err := resolveAdapter(e, q.Get("adapter"))
	if err != nil {
		return err
	}
	page, err := e.ListL2(r.Context(), a.Index, q.Get("model_name"), pageSize, q.Get("page_token"))
	if err != nil {
		switch {
		case statusOf(err) == http.StatusNotImplemented:
			return errf(ErrUnsupported, "L2 adapter '%s' does not support listing: %v", a.TypeName, err)
		case errors.Is(err, l2.ErrBadPageToken):
			return errf(l2.ErrBadPageToken, "malformed page_token: %v", err)
		}
		return err
	}
	out := ObjectPage{Adapter: a.TypeName, Shared: a.Shared, Entries: make([]ObjectEntry, 0, len(page.Entries))}
	for _, en := range page.Entries {
		out.Entries = append(out.Entries, ObjectEntry{Key: en.Key.Encode(), SizeBytes: en.SizeBytes})
	}
	if page.NextPageToken != "" {
		out.NextPageToken = &page.NextPageToken
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handleDeleteObjects(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, maxJSONBody)
	if err != nil {
		return err
	}
	req, err := decodeDeleteObjects(body)
	if err != nil {
		return err
	}
	e, err := s.engineOr("server not initialized")
	if err != nil {
		return err
	}
	var ad *engine.AdapterInfo
	if req.Tier != "l1" {
		a, err := resolveAdapter(e, req.Adapter)
		if err != nil {
			return err
		}
		ad = &a
	}
	out := DeleteObjectsResponse{Requested: len(req.Keys), OK: true}
	if req.Tier == "l1" || req.Tier == "all" {
		out.Deleted, out.Skipped = e.DeleteL1(req.Keys, req.Force)
	}
	if ad != nil {
		out.Adapter = &ad.TypeName
		removed, err := e.DeleteL2(r.Context(), ad.Index, req.Keys)
		out.Deleted += len(removed)
		if err != nil {
			// A 200 body, so the route table's OnError scrub never sees
			// it: scrub here as it would.
			out.OK = false
			out.Error = s.scrub(err.Error())
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// warmJobPrefix namespaces the engine jobs of POST /cache/prefetches. The
// engine keys every prefetch job by id, vLLM's LOOKUP jobs (by the raw
// vLLM request id) and the KV API's probes included, so GET
// /cache/prefetches/{request_id} must look only among the warm jobs: it
// consumed whatever job had that id, taking a vLLM lookup's answer from
// its worker and stranding the read locks it holds. The request_id a
// client sees stays the bare uuid.
const warmJobPrefix = "httpapi-warm:"

// newRequestID is a uuid4 in hex (32 lowercase chars), as upstream.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return hex.EncodeToString(b[:])
}

// groupsOf lists a layout's object group ids.
func groupsOf(l engine.Layout) []int64 {
	n := len(l.GroupObjectBytes)
	if n == 0 {
		return []int64{0}
	}
	g := make([]int64, n)
	for i := range g {
		g[i] = int64(i)
	}
	return g
}

// chunkKeys hashes tokens and expands every full chunk into its keys: for
// each chunk, group-major then rank-minor.
func (s *Server) chunkKeys(l engine.Layout, tokens []int64, salt string) ([][]objkey.Key, error) {
	hashes, err := s.hasher.ChunkHashes(tokens)
	if err != nil {
		return nil, errf(ErrBadRequest, "%v", err)
	}
	if len(hashes) == 0 {
		return nil, nil
	}
	perGroup, err := objkey.FanOut(hashes, l.ModelName, l.WorldSize, -1, groupsOf(l), salt)
	if err != nil {
		return nil, errf(ErrBadRequest, "%v", err)
	}
	ws := l.WorldSize
	chunks := make([][]objkey.Key, len(hashes))
	for c := range chunks {
		keys := make([]objkey.Key, 0, len(perGroup)*ws)
		for _, g := range perGroup {
			keys = append(keys, g[c*ws:(c+1)*ws]...)
		}
		chunks[c] = keys
	}
	return chunks, nil
}

func (s *Server) layoutFor(e Engine, model string, worldSize int) (engine.Layout, error) {
	l, err := e.Layout(model, worldSize)
	if err != nil {
		if errors.Is(err, engine.ErrNoLayout) || errors.Is(err, engine.ErrNotFound) {
			return l, errf(ErrConflict, "no layout registered for model_name='%s' world_size=%d; the model has not allocated KV cache on this node yet", model, worldSize)
		}
		return l, err
	}
	return l, nil
}

func (s *Server) handleSubmitPrefetch(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, maxJSONBody)
	if err != nil {
		return err
	}
	req, err := decodePrefetch(body)
	if err != nil {
		return err
	}
	e, err := s.engineOr("server not initialized")
	if err != nil {
		return err
	}
	l, err := s.layoutFor(e, req.ModelName, req.WorldSize)
	if err != nil {
		return err
	}
	chunks, err := s.chunkKeys(l, req.TokenIDs, req.CacheSalt)
	if err != nil {
		return err
	}
	if len(chunks) == 0 {
		writeJSON(w, http.StatusAccepted, PrefetchSubmitResponse{Status: "noop"})
		return nil
	}
	id := newRequestID()
	if err := e.Prefetch(engine.PrefetchRequest{ID: warmJobPrefix + id, Chunks: chunks, Readers: 0, Sparse: true, Retain: true, Trace: trace.SpanContextFromContext(r.Context())}); err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, PrefetchSubmitResponse{RequestID: id, Chunks: len(chunks), Status: "submitted"})
	return nil
}

func (s *Server) handlePollPrefetch(w http.ResponseWriter, r *http.Request) error {
	e, err := s.engineOr("server not initialized")
	if err != nil {
		return err
	}
	id := r.PathValue("request_id")
	res, err := e.PollPrefetch(warmJobPrefix + id)
	if err != nil {
		if errors.Is(err, engine.ErrNotFound) {
			return errf(ErrNotFound, "unknown prefetch request_id='%s' (already completed or never submitted)", id)
		}
		return err
	}
	if !res.Done {
		writeJSON(w, http.StatusOK, PrefetchPollResponse{RequestID: id, Status: "pending"})
		return nil
	}
	out := PrefetchPollResponse{RequestID: id, Status: "completed", FoundKeys: &res.L2Keys, TotalKeys: &res.TotalKeys}
	if res.Err != nil {
		// The job's first L2 error, in a 200 body the route table's
		// OnError scrub never sees (as DELETE /cache/objects' error):
		// an adapter's text may echo a configured secret.
		out.Error = s.scrub(res.Err.Error())
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handleClear(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, maxSmallBody)
	if err != nil {
		return err
	}
	tier, _, err := decodeClear(body)
	if err != nil {
		return err
	}
	e, err := s.engineOr("server not initialized")
	if err != nil {
		return err
	}
	res := e.Clear()
	s.log.Warn("cache cleared by operator", "tier", tier, "objects", res.Objects, "bytes", res.Bytes)
	writeJSON(w, http.StatusOK, ClearResponse{Status: "ok", Cleared: ClearedTier{Tier: tier}})
	return nil
}

func (s *Server) handleChecksums(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r, maxJSONBody)
	if err != nil {
		return err
	}
	req, _, err := decodeChecksums(body)
	if err != nil {
		return err
	}
	if _, err := s.engineOr("server not initialized"); err != nil {
		return err
	}
	if s.opts.KVBlocks == nil {
		return errf(ErrUnsupported, "checksum not supported for this engine type")
	}
	layers, err := s.opts.KVBlocks.KVLayers(req.InstanceID)
	if err != nil {
		switch statusOf(err) {
		case http.StatusNotFound:
			return errf(ErrNotFound, "instance_id %d not registered", req.InstanceID)
		case http.StatusNotImplemented:
			return errf(ErrUnsupported, "KV format not supported by /cache/checksums: %v", err)
		}
		return err
	}
	if len(req.BlockIDs) == 0 {
		return errf(ErrBadRequest, "block_ids is required")
	}
	if req.ChunkSize <= 0 {
		return errf(ErrBadRequest, "chunk_size must be positive")
	}
	if len(layers) == 0 {
		return errf(ErrNotFound, "kv_caches empty")
	}
	n := len(req.BlockIDs)
	// ceil(n / chunk_size) without n + chunk_size - 1, which overflows
	// for a chunk_size near the int maximum (n >= 1 here).
	numChunks := (n-1)/req.ChunkSize + 1
	// Each block is hashed as soon as it is read and never kept: holding
	// every (layer, block) copy until the end made a request of N ids over
	// L layers hold L*N blocks at once (16 MiB of ids over 32 layers of
	// 64 KiB blocks is terabytes), and KVLayer lets an implementation hand
	// out one reused buffer. Every (layer, block) is read exactly once in
	// both modes, in the order the digests consume them.
	read := func(h hash.Hash, li int, c int) error {
		for i := c * req.ChunkSize; i < min((c+1)*req.ChunkSize, n); i++ {
			// A request may name millions of blocks per layer; once the
			// client is gone nobody reads the answer, so stop reading.
			if err := r.Context().Err(); err != nil {
				return fmt.Errorf("checksums abandoned by the client: %w", err)
			}
			id := req.BlockIDs[i]
			b, err := layers[li].Block(id)
			if err != nil {
				if statusOf(err) == http.StatusInternalServerError {
					return errf(ErrBadRequest, "block %d of layer %d: %v", id, li, err)
				}
				return err
			}
			h.Write(b)
		}
		return nil
	}
	var sums any
	if req.Layerwise {
		m := map[string][]string{}
		for li := range layers {
			l := make([]string, numChunks)
			for c := range l {
				h := md5.New()
				if err := read(h, li, c); err != nil {
					return err
				}
				l[c] = hex.EncodeToString(h.Sum(nil))
			}
			m[fmt.Sprintf("layer_%d", li)] = l
		}
		sums = m
	} else {
		l := make([]string, numChunks)
		for c := range l {
			h := md5.New()
			for li := range layers {
				if err := read(h, li, c); err != nil {
					return err
				}
			}
			l[c] = hex.EncodeToString(h.Sum(nil))
		}
		sums = l
	}
	writeJSON(w, http.StatusOK, ChecksumResponse{
		Status: "success", ChunkSize: req.ChunkSize, NumChunks: numChunks,
		ChunkChecksums: sums, Layerwise: req.Layerwise, BlockIDRanges: blockRanges(req.BlockIDs),
	})
	return nil
}

// blockRanges compresses a block list into upstream's textual form: runs of
// consecutive ids become "[first,last]", singletons stay bare ("0,[2,5],8").
func blockRanges(ids []int) string {
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ids[i]))
		} else {
			parts = append(parts, fmt.Sprintf("[%d,%d]", ids[i], ids[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
