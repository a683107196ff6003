package httpapi

import (
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
	Adapters    []map[string]any `json:"adapters"`
	Backend     string           `json:"backend"`
	Enabled     bool             `json:"enabled"`
	NumAdapters int              `json:"num_adapters"`
}

// ScriptForm documents the POST /run_script multipart form.
type ScriptForm struct {
	Script string `json:"script" doc:"the Starlark source file"`
}
