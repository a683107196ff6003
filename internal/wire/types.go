package wire

//go:generate go run github.com/tinylib/msgp@v1.6.5 -file types.go -o types_gen.go -io=false -tests=false

// Every slice a request decodes is sized from the count its array header
// claims, so without a bound a 20-byte frame claiming 2^32 elements would
// make the server allocate gigabytes before the short input is noticed.
// msgp's limit refuses such a header (msgp.ErrLimitExceeded) before the
// allocation: 2^20 elements is far above any real request (a 1M-token
// prompt has 62,500 blocks of 16), and bounds one frame's allocation to a
// few tens of MiB. TokenIDs decodes itself and checks its count against
// the bytes left instead.
//
//msgp:limit arrays:1048576 maps:1048576

import "github.com/tinylib/msgp/msgp"

// The structs below are LMCache's msgspec dataclasses/Structs. msgspec encodes
// them as maps keyed by field name in declaration order with every field
// present; decoding is by name, ignores unknown keys and leaves missing keys at
// their zero value, which is what the generated code does too. Optional fields
// whose Python type is `X | None` are kept as msgp.Raw so nil survives.

// Key is IPCCacheServerKey, the key of every data request. Fields 9-11 were
// added over time; older clients omit them.
type Key struct {
	ModelName      string   `msg:"model_name"`
	WorldSize      Int      `msg:"world_size"`
	WorkerID       OptInt   `msg:"worker_id"`
	TokenIDs       TokenIDs `msg:"token_ids"`
	Start          Int      `msg:"start"`
	End            Int      `msg:"end"`
	RequestID      string   `msg:"request_id"`
	CacheSalt      string   `msg:"cache_salt"`
	RequestConfigs msgp.Raw `msg:"request_configs"`
	NumKVReaders   Int      `msg:"num_kv_readers"`
	NullChunkMask  msgp.Raw `msg:"null_chunk_mask"`
}

// RegisterPayload is RegisterEngineDrivenContextPayload. The first eight
// fields are stable across versions; the rest are optional and only inspected
// to recognise hybrid (multi-group) models (engine_group_infos is counted,
// not decoded).
type RegisterPayload struct {
	InstanceID           Int      `msg:"instance_id"`
	ModelName            string   `msg:"model_name"`
	WorldSize            Int      `msg:"world_size"`
	BlockSize            Int      `msg:"block_size"`
	NumLayers            Int      `msg:"num_layers"`
	HiddenDimSize        Int      `msg:"hidden_dim_size"`
	DtypeStr             string   `msg:"dtype_str"`
	UseMLA               bool     `msg:"use_mla"`
	NumPhysicalSlots     msgp.Raw `msg:"num_physical_slots"`
	EngineGroupInfos     msgp.Raw `msg:"engine_group_infos"`
	GroupHiddenDimSizes  msgp.Raw `msg:"group_hidden_dim_sizes"`
	GroupLayoutDescs     msgp.Raw `msg:"group_layout_descs"`
	EnableL1KVWeaveQuant bool     `msg:"enable_l1_kvweave_quant"`
}

// RegisterResponse is RegisterEngineDrivenContextResponse. Clients read only
// shm_name and pool_size; the rest is sent for the newest schema.
type RegisterResponse struct {
	ShmName       string   `msg:"shm_name"`
	PoolSize      Int      `msg:"pool_size"`
	ScratchOffset Int      `msg:"scratch_offset"`
	ScratchSize   Int      `msg:"scratch_size"`
	Error         msgp.Raw `msg:"error"`
}

// Slot is one chunk object's place in the shared-memory pool.
type Slot struct {
	Offset Int    `msg:"offset"`
	Length Int    `msg:"length"`
	Shape  []Int  `msg:"shape"`
	Dtype  string `msg:"dtype"`
}

// StoreContext is the SHM context of a PREPARE_STORE reply.
type StoreContext struct {
	Slots        []Slot `msg:"slots"`
	ChunkIndices []Int  `msg:"chunk_indices"`
}

// RetrieveContext is the SHM context of a PREPARE_RETRIEVE reply.
type RetrieveContext struct {
	Slots []Slot `msg:"slots"`
}

// PrepareStoreResponse is PrepareStoreResponse; Context holds an encoded
// StoreContext, or an empty map when the server refuses the store (an empty
// map and a map with empty slots mean different things to the client).
type PrepareStoreResponse struct {
	Context msgp.Raw `msg:"context"`
}

// PrepareRetrieveResponse is PrepareRetrieveResponse; Context holds an
// encoded RetrieveContext or an empty map.
type PrepareRetrieveResponse struct {
	Success bool     `msg:"success"`
	Data    []byte   `msg:"data"`
	Context msgp.Raw `msg:"context"`
}

// TransferReply is the (event_handle, success) tuple STORE and RETRIEVE
// answer with.
//
//msgp:tuple TransferReply
type TransferReply struct {
	Handle []byte
	OK     bool
}

// BlockAllocationRecord is one entry of REPORT_BLOCK_ALLOCATION.
type BlockAllocationRecord struct {
	ReqID       string `msg:"req_id"`
	NewBlockIDs []Int  `msg:"new_block_ids"`
	NewTokenIDs []Int  `msg:"new_token_ids"`
}

// SessionEndInfo is END_SESSION's optional second payload (newest clients).
type SessionEndInfo struct {
	FinishReason string `msg:"finish_reason"`
	StopTokenID  Int    `msg:"stop_token_id"`
}
