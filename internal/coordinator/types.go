package coordinator

import (
	"github.com/lmcache-go/lmcache/internal/coordinator/eventgate"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Request and response bodies of the coordinator API. Handlers write the
// response types and the route table names both, so /openapi.json's
// schemas are generated from exactly what is served. The request types
// document the bodies; the validators in validate.go read them field by
// field (Pydantic's lax rules and FastAPI's 422 items need more than
// encoding/json). Fields of the types that replaced sorted maps are in
// JSON-name order, so those bodies are byte-identical to before.

// RegisterRequest documents the POST /instances body.
type RegisterRequest struct {
	IP               string            `json:"ip"`
	HTTPPort         int               `json:"http_port" doc:"1..65535"`
	InstanceID       string            `json:"instance_id,omitempty" maxLength:"256" doc:"default ip:http_port"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	P2PAdvertisedURL string            `json:"p2p_advertised_url,omitempty"`
	MQPort           int               `json:"mq_port,omitempty"`
}

// RegisterResponse is POST /instances.
type RegisterResponse struct {
	InstanceID   string `json:"instance_id"`
	ReRegistered bool   `json:"re_registered"`
}

// HeartbeatResponse is PUT /instances/{instance_id}/heartbeat.
type HeartbeatResponse struct {
	InstanceID string `json:"instance_id"`
}

// InstanceRow is one registered MP server of GET /instances.
type InstanceRow struct {
	InstanceID       string            `json:"instance_id"`
	IP               string            `json:"ip"`
	HTTPPort         int               `json:"http_port"`
	RegistrationTime pyFloat           `json:"registration_time"`
	Metadata         map[string]string `json:"metadata"`
	P2PAdvertisedURL string            `json:"p2p_advertised_url"`
	MQPort           int               `json:"mq_port"`
	// Ours: the instance's event streams as the gate sees them (null
	// until that door got a batch) and its L1 usage from POST /events.
	EventStream      *eventgate.StreamStats `json:"event_stream"`
	QuotaEventStream *eventgate.StreamStats `json:"quota_event_stream"`
	L1UsedBytes      int64                  `json:"l1_used_bytes"`
	L1Keys           int                    `json:"l1_keys"`
	// Ours: the last registration or heartbeat, Unix seconds.
	LastHeartbeatTime pyFloat `json:"last_heartbeat_time"`
}

// InstancesResponse is GET /instances.
type InstancesResponse struct {
	Instances []InstanceRow `json:"instances"`
}

// HealthzResponse is GET /healthz; state_file_corrupt only with
// --state-file.
type HealthzResponse struct {
	StateFileCorrupt *bool  `json:"state_file_corrupt,omitempty"`
	Status           string `json:"status"`
}

// DefaultLimitRequest documents the PUT /quota/config body (null or absent
// re-exempts unquota'd salts).
type DefaultLimitRequest struct {
	DefaultLimitGB *float64 `json:"default_limit_gb" doc:">= 0 or null"`
	Tier           string   `json:"tier,omitempty" enum:"l2"`
}

// DefaultLimitResponse is PUT and GET /quota/config.
type DefaultLimitResponse struct {
	DefaultLimitGB *pyFloat `json:"default_limit_gb"`
}

// SetQuotaRequest documents the PUT /quota/{cache_salt} body.
type SetQuotaRequest struct {
	LimitGB float64 `json:"limit_gb" doc:">= 0"`
	Tier    string  `json:"tier,omitempty" enum:"l2"`
}

// QuotaResponse is PUT and DELETE /quota/{cache_salt}.
type QuotaResponse struct {
	CacheSalt string  `json:"cache_salt"`
	LimitGB   pyFloat `json:"limit_gb"`
	Status    string  `json:"status" enum:"ok,removed,not_found"`
}

// UsageResponse is GET /quota.
type UsageResponse struct {
	TotalGB     pyFloat      `json:"total_gb"`
	ByCacheSalt []saltStatus `json:"by_cache_salt"`
}

// UsageEvent documents one event of a POST /quota/events batch.
type UsageEvent struct {
	Type  string         `json:"type" enum:"store,lookup,delete"`
	Key   objkey.Encoded `json:"key"`
	Bytes int64          `json:"bytes" doc:">= 0"`
}

// ReportUsageRequest documents the POST /quota/events body.
type ReportUsageRequest struct {
	InstanceID string       `json:"instance_id" maxLength:"256"`
	Seq        int64        `json:"seq" doc:">= 1"`
	Tier       string       `json:"tier,omitempty" enum:"l2"`
	Events     []UsageEvent `json:"events"`
}

// RecordedResponse documents POST /quota/events (written by the ingest
// fast path without encoding/json).
type RecordedResponse struct {
	Recorded int `json:"recorded"`
}

// CacheEventEntry documents one entry of a cache-event batch.
type CacheEventEntry struct {
	Key         objkey.Encoded `json:"key"`
	SizeBytes   int64          `json:"size_bytes,omitempty"`
	TokenIDs    []int64        `json:"token_ids,omitempty"`
	TokenOffset int64          `json:"token_offset,omitempty" doc:">= 0, or -1 when unknown"`
}

// CacheEventBatch documents one batch of POST /events.
type CacheEventBatch struct {
	InstanceID       string            `json:"instance_id" maxLength:"256"`
	Incarnation      int64             `json:"incarnation"`
	Seq              int64             `json:"seq"`
	EventType        string            `json:"event_type" enum:"store,delete,access,config"`
	Tier             string            `json:"tier" enum:"l1,l2,all"`
	Backend          string            `json:"backend"`
	Shared           bool              `json:"shared,omitempty"`
	TS               float64           `json:"ts,omitempty"`
	CapacityBytes    int64             `json:"capacity_bytes,omitempty"`
	CapacityRevision int64             `json:"capacity_revision,omitempty"`
	Entries          []CacheEventEntry `json:"entries,omitempty"`
}

// CacheEventsRequest documents the POST /events body.
type CacheEventsRequest struct {
	Batches []CacheEventBatch `json:"batches"`
}

// CacheEventsResponse is POST /events.
type CacheEventsResponse struct {
	Applied    int `json:"applied"`
	Duplicates int `json:"duplicates"`
	Stale      int `json:"stale"`
}

// PrefetchRequest documents the POST /cache/prefetches body.
type PrefetchRequest struct {
	InstanceID string  `json:"instance_id" maxLength:"256"`
	ModelName  string  `json:"model_name" maxLength:"1024"`
	WorldSize  int64   `json:"world_size" doc:">= 1"`
	TokenIDs   []int64 `json:"token_ids,omitempty"`
	CacheSalt  string  `json:"cache_salt,omitempty"`
}

// PinRequest documents the POST and DELETE /cache/pins body.
type PinRequest struct {
	ModelName string  `json:"model_name" maxLength:"1024"`
	WorldSize int64   `json:"world_size" doc:">= 1"`
	TokenIDs  []int64 `json:"token_ids,omitempty"`
	CacheSalt string  `json:"cache_salt,omitempty"`
}

// PrefetchStatusResponse documents the relayed poll. The handler passes
// the MP server's own body through verbatim and never marshals this type;
// it gives the OpenAPI document the shape that body has: the spec's
// {"status": "pending"} and {"status": "completed", "found_keys": 12,
// "total_keys": 12}, plus the request_id and load error an lmcache-go MP
// server adds (internal/httpapi.PrefetchPollResponse).
type PrefetchStatusResponse struct {
	Status    string `json:"status" enum:"pending,completed"`
	FoundKeys *int   `json:"found_keys,omitempty" doc:"with completed: requested chunks that were resident"`
	TotalKeys *int   `json:"total_keys,omitempty" doc:"with completed: requested chunks"`
	RequestID string `json:"request_id,omitempty"`
	Error     string `json:"error,omitempty"`
}
