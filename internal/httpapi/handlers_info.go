package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/redact"
)

func (s *Server) handleRoot(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, RootResponse{Status: "ok", Service: "LMCache HTTP API"})
	return nil
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) error {
	if _, err := s.engine(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, HealthResponse{Status: "unhealthy", Reason: "engine not initialized"})
		return nil
	}
	writeJSON(w, http.StatusOK, HealthResponse{Status: "healthy"})
	return nil
}

// engineOr wraps s.engine with the message a route reports.
func (s *Server) engineOr(msg string) (Engine, error) {
	e, err := s.engine()
	if err != nil {
		return nil, errf(ErrNotInitialized, "%s", msg)
	}
	return e, nil
}

func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) error {
	e, err := s.engineOr("engine not initialized")
	if err != nil {
		return err
	}
	sm := e.Status()
	healthy := true
	if v, ok := sm["is_healthy"].(bool); ok {
		healthy = v
	}
	layouts := e.Layouts()
	ctxMeta := map[string]CacheContext{}
	// Ours: every layout in force, static (--register-model) or from a
	// worker's registration. The data path's StatusExtra replaces
	// cache_context_meta with its workers' contexts, so without this a
	// server serving a --register-model layout lists no model.
	models := make([]ModelLayout, 0, len(layouts))
	for i, l := range layouts {
		meta := map[string]any{}
		for k, v := range l.Meta {
			meta[k] = v
		}
		ctxMeta[strconv.Itoa(i)] = CacheContext{ModelName: l.ModelName, WorldSize: l.WorldSize, ObjectBytes: &l.ObjectBytes, KVCacheLayout: KVCacheLayout{Meta: meta}}
		models = append(models, ModelLayout{ModelName: l.ModelName, WorldSize: l.WorldSize, ObjectBytes: l.ObjectBytes})
	}
	out := StatusResponse{
		IsHealthy:          healthy,
		EngineType:         "MPCacheServer",
		ChunkSize:          s.hasher.ChunkSize(),
		HashAlgorithm:      s.hasher.Algorithm(),
		ActiveSessions:     0,
		RegisteredGPUIDs:   []int64{},
		CacheContextMeta:   ctxMeta,
		ActivePrefetchJobs: e.Counters().ActivePrefetchJobs,
		StorageManager:     sm,
		ModelLayouts:       models,
	}
	if s.opts.StatusExtra != nil {
		dp := s.opts.StatusExtra()
		out.ActiveSessions = dp.ActiveSessions
		out.CacheContextMeta = dp.CacheContextMeta
		if out.CacheContextMeta == nil {
			out.CacheContextMeta = map[string]CacheContext{}
		}
		if dp.RegisteredGPUIDs != nil {
			out.RegisteredGPUIDs = dp.RegisteredGPUIDs
		}
		out.PendingLookups, out.PendingTransfers, out.KVEvents = &dp.PendingLookups, &dp.PendingTransfers, &dp.KVEvents
	}
	return writeRedactedJSON(w, http.StatusOK, out)
}

func (s *Server) handleConfig(w http.ResponseWriter, _ *http.Request) error {
	if s.opts.Config == nil {
		return errf(ErrNotInitialized, "configs not initialized")
	}
	tree, err := redactedTree(newConfigResponse(s.opts.Config))
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(tree); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
	return nil
}

// redactedTree turns v into its JSON tree (json.Number keeps numbers as
// they were written) with every secret-looking field hidden, including
// inside JSON strings such as --l2-adapter values.
func redactedTree(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return redact.Value(tree), nil
}

// writeRedactedJSON is writeJSON for values that may carry configuration
// (engine status, adapter descriptions). A value that cannot be encoded is
// returned (nothing written), so the route table answers the 500 in the
// route's error shape.
func writeRedactedJSON(w http.ResponseWriter, code int, v any) error {
	tree, err := redactedTree(v)
	if err != nil {
		return fmt.Errorf("response: %w", err)
	}
	writeJSON(w, code, tree)
	return nil
}

func (s *Server) handleConfigAdapters(w http.ResponseWriter, _ *http.Request) error {
	e, err := s.engineOr("server not initialized")
	if err != nil {
		return err
	}
	out := []AdapterEntry{}
	for i, a := range e.Adapters() {
		out = append(out, AdapterEntry{
			Index: a.Index, TypeName: a.TypeName, Tier: "l2",
			Primary: i == 0, Reconfigurable: a.Reconfigurable, Shared: a.Shared,
		})
	}
	return writeRedactedJSON(w, http.StatusOK, AdaptersResponse{Adapters: out})
}

func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) error {
	v, c := s.opts.Version, s.opts.Commit
	if v == "" {
		v = "NA"
	}
	if c == "" {
		c = "NA"
	}
	writeJSON(w, http.StatusOK, v+"-"+c)
	return nil
}

func (s *Server) handleLMCVersion(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, s.opts.Version)
	return nil
}

func (s *Server) handleCommitID(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, s.opts.Commit)
	return nil
}

// resolveAdapter picks the adapter by type_name ("" = primary); the first
// match wins on duplicates.
func resolveAdapter(e Engine, name string) (engine.AdapterInfo, error) {
	ads := e.Adapters()
	if len(ads) == 0 {
		return engine.AdapterInfo{}, errf(ErrUnavailable, "no L2 adapters configured")
	}
	if name == "" {
		return ads[0], nil
	}
	for _, a := range ads {
		if a.TypeName == name {
			return a, nil
		}
	}
	return engine.AdapterInfo{}, errf(ErrNotFound, "no L2 adapter with type_name='%s'", name)
}
