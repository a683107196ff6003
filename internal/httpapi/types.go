package httpapi

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Request and response bodies of the API. Handlers write these types and
// the route table names them, so /openapi.json's schemas are generated from
// exactly what is served. The request types document the bodies; the
// strict decoders in decode.go (which report FastAPI's 422 items) read
// them. Fields are declared in JSON-name order: the bodies are
// byte-identical to the sorted maps they replace.

// RootResponse is GET /.
type RootResponse struct {
	Service string `json:"service"`
	Status  string `json:"status"`
}

// HealthResponse is GET /healthcheck (reason only when unhealthy).
type HealthResponse struct {
	Reason string `json:"reason,omitempty"`
	Status string `json:"status" enum:"healthy,unhealthy"`
}

// AdapterEntry is one adapter of GET /config/adapters.
type AdapterEntry struct {
	Index          int    `json:"index"`
	Primary        bool   `json:"primary"`
	Reconfigurable bool   `json:"reconfigurable"`
	Shared         bool   `json:"shared"`
	Tier           string `json:"tier"`
	TypeName       string `json:"type_name"`
}

// AdaptersResponse is GET /config/adapters.
type AdaptersResponse struct {
	Adapters []AdapterEntry `json:"adapters"`
}

// ObjectEntry is one listed L2 object.
type ObjectEntry struct {
	Key       objkey.Encoded `json:"key"`
	SizeBytes int64          `json:"size_bytes"`
}

// ObjectPage is GET /cache/objects.
type ObjectPage struct {
	Adapter       string        `json:"adapter"`
	Entries       []ObjectEntry `json:"entries"`
	NextPageToken *string       `json:"next_page_token"`
	Shared        bool          `json:"shared"`
}

// DeleteObjectsRequest documents the DELETE /cache/objects body.
type DeleteObjectsRequest struct {
	Adapter string           `json:"adapter,omitempty" doc:"adapter type name; default the primary adapter"`
	Force   bool             `json:"force,omitempty"`
	Keys    []objkey.Encoded `json:"keys"`
	Tier    string           `json:"tier,omitempty" enum:"l1,l2,all" doc:"default l2"`
}

// DeleteObjectsResponse is DELETE /cache/objects.
type DeleteObjectsResponse struct {
	Adapter   *string `json:"adapter"`
	Deleted   int     `json:"deleted"`
	Error     string  `json:"error,omitempty"`
	OK        bool    `json:"ok"`
	Requested int     `json:"requested"`
	Skipped   int     `json:"skipped"`
}

// PrefetchRequest documents the POST /cache/prefetches body.
type PrefetchRequest struct {
	CacheSalt  string  `json:"cache_salt,omitempty"`
	ModelName  string  `json:"model_name"`
	SourceTier string  `json:"source_tier,omitempty" enum:"l2"`
	TargetTier string  `json:"target_tier,omitempty" enum:"l1"`
	TokenIDs   []int64 `json:"token_ids"`
	WorldSize  int     `json:"world_size"`
}

// PrefetchSubmitResponse is POST /cache/prefetches (no request_id for a
// noop).
type PrefetchSubmitResponse struct {
	Chunks    int    `json:"chunks"`
	RequestID string `json:"request_id,omitempty"`
	Status    string `json:"status" enum:"submitted,noop"`
}

// PrefetchPollResponse is GET /cache/prefetches/{request_id}; the counts
// come with "completed" only.
type PrefetchPollResponse struct {
	Error     string `json:"error,omitempty"`
	FoundKeys *int   `json:"found_keys,omitempty"`
	RequestID string `json:"request_id"`
	Status    string `json:"status" enum:"pending,completed"`
	TotalKeys *int   `json:"total_keys,omitempty"`
}

// ClearRequest documents the POST /cache/clear body.
type ClearRequest struct {
	Force bool   `json:"force,omitempty"`
	Tier  string `json:"tier,omitempty" enum:"l1,l2,all"`
}

// ClearedTier is the "cleared" member of ClearResponse.
type ClearedTier struct {
	Tier string `json:"tier"`
}

// ClearResponse is POST /cache/clear.
type ClearResponse struct {
	Cleared ClearedTier `json:"cleared"`
	Status  string      `json:"status"`
}

// ChecksumRequest documents the POST /cache/checksums body.
type ChecksumRequest struct {
	BlockIDs   []int `json:"block_ids"`
	ChunkSize  int   `json:"chunk_size"`
	InstanceID int   `json:"instance_id,omitempty"`
	Layerwise  bool  `json:"layerwise,omitempty"`
}

// ChecksumResponse is POST /cache/checksums. ChunkChecksums is a list of
// hex digests, or with layerwise a map of layer index to such a list.
type ChecksumResponse struct {
	BlockIDRanges  string `json:"block_id_ranges"`
	ChunkChecksums any    `json:"chunk_checksums"`
	ChunkSize      int    `json:"chunk_size"`
	Layerwise      bool   `json:"layerwise"`
	NumChunks      int    `json:"num_chunks"`
	Status         string `json:"status"`
}

// KVRequest documents the JSON body of /api/kv/retrieve and
// /api/kv/lookup (without a JSON content type, the X-LMCache-* headers
// carry the same fields).
type KVRequest struct {
	CacheSalt string  `json:"cache_salt,omitempty"`
	ModelName string  `json:"model_name"`
	Tokens    []int64 `json:"tokens"`
	WorldSize int     `json:"world_size,omitempty" doc:"1..255; default: the model's one registered layout"`
	// ProtocolVersion asks a retrieve for newer upstream's framed answer.
	ProtocolVersion int `json:"protocol_version,omitempty" doc:"1: answer in application/x-lmcache-kv-stream frames"`
}

// KVStoreResponse is POST /api/kv/store: upstream's status and
// total_/stored_ counts, plus our chunks, tokens, keys and stored (objects
// newly written; already resident ones are skipped).
type KVStoreResponse struct {
	Chunks       int    `json:"chunks"`
	Keys         int    `json:"keys"`
	Status       string `json:"status"`
	Stored       int    `json:"stored"`
	StoredChunks int    `json:"stored_chunks"`
	StoredTokens int    `json:"stored_tokens"`
	Tokens       int    `json:"tokens"`
	TotalChunks  int    `json:"total_chunks"`
	TotalTokens  int    `json:"total_tokens"`
}

// KVLookupResponse is POST /api/kv/lookup.
type KVLookupResponse struct {
	HitChunks   int `json:"hit_chunks"`
	HitTokens   int `json:"hit_tokens"`
	L1Keys      int `json:"l1_keys"`
	L2Keys      int `json:"l2_keys"`
	TotalChunks int `json:"total_chunks"`
	TotalTokens int `json:"total_tokens"`
}

// QuotaUsage is one salt of GET /quota.
type QuotaUsage struct {
	CurrentUsageGB float64 `json:"current_usage_gb"`
	LimitGB        float64 `json:"limit_gb"`
}

// QuotaListResponse is GET /quota, keyed by path segment (_default for the
// empty salt).
type QuotaListResponse struct {
	Users map[string]QuotaUsage `json:"users"`
}

// QuotaPutRequest documents the PUT /quota/{cache_salt} body.
type QuotaPutRequest struct {
	LimitGB float64 `json:"limit_gb"`
}

// QuotaPutResponse is PUT /quota/{cache_salt}.
type QuotaPutResponse struct {
	CacheSalt string  `json:"cache_salt"`
	LimitGB   float64 `json:"limit_gb"`
	Status    string  `json:"status"`
}

// QuotaGetResponse is GET /quota/{cache_salt}.
type QuotaGetResponse struct {
	CacheSalt      string  `json:"cache_salt"`
	CurrentUsageGB float64 `json:"current_usage_gb"`
	Exists         bool    `json:"exists"`
	LimitGB        float64 `json:"limit_gb"`
}

// QuotaDeleteResponse is DELETE /quota/{cache_salt}.
type QuotaDeleteResponse struct {
	CacheSalt string `json:"cache_salt"`
	Status    string `json:"status" enum:"removed,not_found"`
}

// ReconfigureStatusResponse is GET /reconfigure/{backend}/status; each
// adapter entry is the backend's own status object plus adapter_index.
type ReconfigureStatusResponse struct {
	Adapters    []ReconfigureAdapter `json:"adapters"`
	Backend     string               `json:"backend"`
	Enabled     bool                 `json:"enabled"`
	NumAdapters int                  `json:"num_adapters"`
}

// ScriptForm documents the POST /run_script multipart form.
type ScriptForm struct {
	Script string `json:"script" doc:"the Starlark source file"`
}

// StatusResponse is GET /status and GET /api/status: upstream's
// engine-level fields, the storage manager's own status, the data path's
// fields (Options.StatusExtra, a DataPathStatus) and ours (model_layouts).
type StatusResponse struct {
	ActivePrefetchJobs int64                   `json:"active_prefetch_jobs"`
	ActiveSessions     int                     `json:"active_sessions"`
	CacheContextMeta   map[string]CacheContext `json:"cache_context_meta" doc:"registered KV cache contexts, keyed by instance id (or layout index without a data path)"`
	ChunkSize          int                     `json:"chunk_size"`
	EngineType         string                  `json:"engine_type"`
	HashAlgorithm      string                  `json:"hash_algorithm"`
	IsHealthy          bool                    `json:"is_healthy"`
	// KVEvents, PendingLookups and PendingTransfers come from the ZMQ
	// data path; a server without one has none of them.
	KVEvents         *KVEventsStatus `json:"kv_events,omitempty"`
	ModelLayouts     []ModelLayout   `json:"model_layouts"`
	PendingLookups   *int            `json:"pending_lookups,omitempty" doc:"LOOKUPs whose result no QUERY_PREFETCH_STATUS has taken yet"`
	PendingTransfers *int            `json:"pending_transfers,omitempty" doc:"PREPARE_STORE/PREPARE_RETRIEVE awaiting their COMMIT"`
	RegisteredGPUIDs []int64         `json:"registered_gpu_ids"`
	// StorageManager is free-form: the engine's snapshot, whose fields
	// are backend-specific (upstream documents it as such).
	StorageManager map[string]any `json:"storage_manager" doc:"storage manager status; backend-specific fields"`
}

// DataPathStatus is the ZMQ data path's part of GET /status
// (Options.StatusExtra). Its fields replace the engine-level defaults:
// CacheContextMeta replaces the engine layouts' contexts (a nil map is
// written as {}), RegisteredGPUIDs the empty list (nil is written as []),
// and the other three are always written.
type DataPathStatus struct {
	// ActiveSessions is the number of open sessions.
	ActiveSessions int
	// CacheContextMeta are the data path's registered contexts, keyed by
	// instance id.
	CacheContextMeta map[string]CacheContext
	// KVEvents is the POLL_KV_EVENTS log's and publisher's state.
	KVEvents KVEventsStatus
	// PendingLookups are LOOKUPs whose result is not yet taken.
	PendingLookups int
	// PendingTransfers are prepared stores and retrieves awaiting COMMIT.
	PendingTransfers int
	// RegisteredGPUIDs are the registered workers' instance ids.
	RegisteredGPUIDs []int64
}

// CacheContext is one entry of StatusResponse.CacheContextMeta.
type CacheContext struct {
	KVCacheLayout KVCacheLayout `json:"kv_cache_layout" doc:"the registered KV layout; fields depend on the registration"`
	ModelName     string        `json:"model_name"`
	// ObjectBytes comes with the engine's layouts, Transfer with the data
	// path's lmcache-driven registrations.
	ObjectBytes *int64  `json:"object_bytes,omitempty"`
	Transfer    *string `json:"transfer,omitempty"`
	WorldSize   int     `json:"world_size"`
}

// KVCacheLayout is a cache context's kv_cache_layout: for a data-path
// (lmcache-driven) registration, its paged KV cache as upstream's
// transfer module reports it (the typed fields); for an engine layout (a
// server without a data path), that layout's own metadata (Meta), whose
// fields depend on where the layout came from. The typed fields are
// omitempty so the schema requires none of them (an engine layout has
// other members); a registration's are never zero (a layout has at least
// one layer and block, and one kernel group).
type KVCacheLayout struct {
	// CacheSizePerToken is the L1 bytes one token takes (all layers, K
	// and V unless MLA).
	CacheSizePerToken int64         `json:"cache_size_per_token,omitempty"`
	KernelGroups      []KernelGroup `json:"kernel_groups,omitempty"`
	NumBlocks         int64         `json:"num_blocks,omitempty"`
	NumLayers         int64         `json:"num_layers,omitempty"`
	// Meta, when not nil, is written instead of the typed fields.
	Meta map[string]any `json:"-"`
}

// MarshalJSON writes Meta when set, else the typed fields.
func (l KVCacheLayout) MarshalJSON() ([]byte, error) {
	if l.Meta != nil {
		return json.Marshal(l.Meta)
	}
	type plain KVCacheLayout
	return json.Marshal(plain(l))
}

// KernelGroup is one kernel group of a registration's kv_cache_layout; a
// registration here always has exactly one (hybrid models are refused).
type KernelGroup struct {
	Dtype          string  `json:"dtype"`
	EngineGroupIdx int     `json:"engine_group_idx"`
	EngineKVFormat string  `json:"engine_kv_format"`
	HeadSize       int64   `json:"head_size"`
	IsMLA          bool    `json:"is_mla"`
	KernelGroupIdx int     `json:"kernel_group_idx"`
	LayerIndices   []int64 `json:"layer_indices"`
	NumKVHeads     int64   `json:"num_kv_heads"`
	NumLayers      int64   `json:"num_layers"`
	ObjectGroupIdx int     `json:"object_group_idx"`
	SlotsPerBlock  int64   `json:"slots_per_block"`
	TokensPerBlock int64   `json:"tokens_per_block"`
}

// KVEventsStatus is GET /status's kv_events: the POLL_KV_EVENTS log and
// the vLLM-format publisher. All but enabled and incarnation are present
// only with the log on, the endpoints only with the publisher.
type KVEventsStatus struct {
	Enabled           bool    `json:"enabled"`
	Incarnation       int64   `json:"incarnation"`
	LogCapacity       *int    `json:"log_capacity,omitempty"`
	LogDepth          *int    `json:"log_depth,omitempty"`
	LostMarkers       *int    `json:"lost_markers,omitempty"`
	NextSeq           *int64  `json:"next_seq,omitempty"`
	PublisherEndpoint *string `json:"publisher_endpoint,omitempty"`
	ReplayEndpoint    *string `json:"replay_endpoint,omitempty"`
	UnboundStores     *int64  `json:"unbound_stores,omitempty"`
}

// ModelLayout is one layout in force (ours): static (--register-model) or
// from a worker's registration.
type ModelLayout struct {
	ModelName   string `json:"model_name"`
	ObjectBytes int64  `json:"object_bytes"`
	WorldSize   int    `json:"world_size"`
}

// ConfigResponse is GET /config: the resolved settings by group. Each group
// is free-form (its keys are that group's settings, secrets redacted); the
// three upstream names are typed so the document lists them, and a further
// group goes to Others.
type ConfigResponse struct {
	MP             map[string]any `json:"mp,omitzero" doc:"MP server settings (free-form)"`
	Observability  map[string]any `json:"observability,omitzero" doc:"observability settings (free-form)"`
	StorageManager map[string]any `json:"storage_manager,omitzero" doc:"storage manager settings (free-form)"`
	// Others are groups beyond the three, written beside them.
	Others map[string]any `json:"-"`
}

// MarshalJSON writes the groups as one object.
func (r ConfigResponse) MarshalJSON() ([]byte, error) {
	type plain ConfigResponse
	return mergeJSON(plain(r), r.Others)
}

// newConfigResponse splits the configured groups. A group present with a
// nil value goes to Others, which writes it as null as the map did
// (omitzero would drop it).
func newConfigResponse(groups map[string]map[string]any) ConfigResponse {
	var out ConfigResponse
	for name, g := range groups {
		var dst *map[string]any
		switch name {
		case "mp":
			dst = &out.MP
		case "observability":
			dst = &out.Observability
		case "storage_manager":
			dst = &out.StorageManager
		}
		if dst == nil || g == nil {
			if out.Others == nil {
				out.Others = map[string]any{}
			}
			out.Others[name] = g
			continue
		}
		*dst = g
	}
	return out
}

// ReconfigureAdapter is one adapter of GET /reconfigure/{backend}/status:
// the backend's own status object (free-form, Status) plus adapter_index,
// the adapter's position among the backend's adapters.
type ReconfigureAdapter struct {
	AdapterIndex int `json:"adapter_index"`
	// Status is the backend's status object; its adapter_index, if any,
	// is replaced by ours.
	Status map[string]any `json:"-"`
}

// MarshalJSON writes the backend's status with adapter_index.
func (r ReconfigureAdapter) MarshalJSON() ([]byte, error) {
	type plain ReconfigureAdapter
	return mergeJSON(plain(r), r.Status, "adapter_index")
}

// ReconfigureRequest documents the POST /reconfigure/{backend}/{operation}
// body. The fields are DAX's (add: device_path, size; remove: device_path,
// mode, force; resize: all four); other backends take an object of their
// own fields, passed through verbatim but for adapter_index.
type ReconfigureRequest struct {
	AdapterIndex int    `json:"adapter_index,omitempty" doc:"position among the backend's adapters; default 0"`
	DevicePath   string `json:"device_path,omitempty" doc:"dax: the device"`
	Force        bool   `json:"force,omitempty" doc:"dax remove/resize"`
	Mode         string `json:"mode,omitempty" enum:"migrate,evict,drain" doc:"dax remove/resize; default migrate (drain: remove only)"`
	Size         any    `json:"size,omitempty" doc:"dax add/resize: a byte count or a string such as \"100GiB\""`
}

// ReconfigureResponse is POST /reconfigure/{backend}/{operation}: the
// backend's own result object (Result, free-form); the typed fields are
// those DAX's results carry, filled from it, and adapter_index is the
// backend-local index the request named.
type ReconfigureResponse struct {
	AdapterIndex *int   `json:"adapter_index,omitempty"`
	Operation    string `json:"operation,omitempty"`
	Status       string `json:"status,omitempty"`
	// Result is the backend's result, written as is (its adapter_index
	// replaced by AdapterIndex).
	Result map[string]any `json:"-"`
}

// MarshalJSON writes the backend's result with the typed fields.
func (r ReconfigureResponse) MarshalJSON() ([]byte, error) {
	type plain ReconfigureResponse
	return mergeJSON(plain(r), r.Result, "adapter_index")
}

// newReconfigureResponse types a backend's result; adapter_index, where
// the backend reports one, becomes idx.
func newReconfigureResponse(res map[string]any, idx int) ReconfigureResponse {
	out := ReconfigureResponse{Result: res}
	if _, ok := res["adapter_index"]; ok {
		out.AdapterIndex = &idx
	}
	out.Operation, _ = res["operation"].(string)
	out.Status, _ = res["status"].(string)
	return out
}

// mergeJSON marshals typed (a struct without a MarshalJSON of its own) and
// writes extra's members over it, except the keys in keep, where typed's
// value stands. The result is one JSON object with sorted keys, as the
// map[string]any bodies these types replaced.
func mergeJSON(typed any, extra map[string]any, keep ...string) ([]byte, error) {
	b, err := json.Marshal(typed)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", typed, err)
	}
	if len(extra) == 0 {
		return b, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("merge %T: %w", typed, err)
	}
	for k, v := range extra {
		if slices.Contains(keep, k) {
			if _, ok := m[k]; ok {
				continue
			}
		}
		vb, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode %q: %w", k, err)
		}
		m[k] = vb
	}
	return json.Marshal(m)
}
