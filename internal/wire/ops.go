package wire

import (
	"fmt"
	"strings"

	"github.com/tinylib/msgp/msgp"
)

// Op is an operation independent of any numbering. Its String is the
// snake_case operation name that the newest clients send as a string.
type Op int

// Operations known in at least one mainline numbering. Ops the server does not
// implement are still named so logs and rejections say what arrived.
const (
	OpUnknown Op = iota
	OpRegisterKVCache
	OpUnregisterKVCache
	OpRegisterQCache
	OpUnregisterQCache
	OpStoreQ
	OpStore
	OpRetrieve
	OpLookup
	OpQueryPrefetchStatus
	OpWaitPrefetchStatus
	OpQueryPrefetchLookupHits
	OpFreeLookupLocks
	OpEndSession
	OpRegisterEngineDriven
	OpUnregisterEngineDriven
	OpPrepareStore
	OpCommitStore
	OpPrepareRetrieve
	OpCommitRetrieve
	OpClear
	OpGetChunkSize
	OpPing
	OpReportBlockAllocation
	OpNoop
	OpCBRegisterRope
	OpCBUnregisterRope
	OpCBRetrievePreComputed
	OpCBUnifiedLookup
	OpP2PLookupAndLock
	OpP2PQueryLookupResults
	OpP2PUnlockObjects
	OpGetExperimental
	OpCBProtocolHandshake
	OpPollKVEvents
	OpCBRegisterKVCache
	OpCBUnregisterKVCache
	OpCBStorePreComputed
	OpCBLookupPreComputed
	OpCBStoreFinal
	OpCBLookupPreComputedV2
	OpCBRetrievePreComputedV2
	opCount
)

var opNames = [opCount]string{
	OpUnknown:                 "unknown",
	OpRegisterKVCache:         "register_kv_cache",
	OpUnregisterKVCache:       "unregister_kv_cache",
	OpRegisterQCache:          "register_q_cache",
	OpUnregisterQCache:        "unregister_q_cache",
	OpStoreQ:                  "store_q",
	OpStore:                   "store",
	OpRetrieve:                "retrieve",
	OpLookup:                  "lookup",
	OpQueryPrefetchStatus:     "query_prefetch_status",
	OpWaitPrefetchStatus:      "wait_prefetch_status",
	OpQueryPrefetchLookupHits: "query_prefetch_lookup_hits",
	OpFreeLookupLocks:         "free_lookup_locks",
	OpEndSession:              "end_session",
	OpRegisterEngineDriven:    "register_kv_cache_engine_driven_context",
	OpUnregisterEngineDriven:  "unregister_kv_cache_engine_driven_context",
	OpPrepareStore:            "prepare_store",
	OpCommitStore:             "commit_store",
	OpPrepareRetrieve:         "prepare_retrieve",
	OpCommitRetrieve:          "commit_retrieve",
	OpClear:                   "clear",
	OpGetChunkSize:            "get_chunk_size",
	OpPing:                    "ping",
	OpReportBlockAllocation:   "report_block_allocation",
	OpNoop:                    "noop",
	OpCBRegisterRope:          "cb_register_rope",
	OpCBUnregisterRope:        "cb_unregister_rope",
	OpCBRetrievePreComputed:   "cb_retrieve_pre_computed",
	OpCBUnifiedLookup:         "cb_unified_lookup",
	OpP2PLookupAndLock:        "p2p_lookup_and_lock",
	OpP2PQueryLookupResults:   "p2p_query_lookup_results",
	OpP2PUnlockObjects:        "p2p_unlock_objects",
	OpGetExperimental:         "get_experimental",
	OpCBProtocolHandshake:     "cb_protocol_handshake",
	OpPollKVEvents:            "poll_kv_events",
	OpCBRegisterKVCache:       "cb_register_kv_cache",
	OpCBUnregisterKVCache:     "cb_unregister_kv_cache",
	OpCBStorePreComputed:      "cb_store_pre_computed",
	OpCBLookupPreComputed:     "cb_lookup_pre_computed",
	OpCBStoreFinal:            "cb_store_final",
	OpCBLookupPreComputedV2:   "cb_lookup_pre_computed_v2",
	OpCBRetrievePreComputedV2: "cb_retrieve_pre_computed_v2",
}

var opByName = func() map[string]Op {
	m := make(map[string]Op, opCount)
	for i := Op(1); i < opCount; i++ {
		m[opNames[i]] = i
	}
	return m
}()

// String returns the snake_case operation name.
func (o Op) String() string {
	if o <= OpUnknown || o >= opCount {
		return "unknown"
	}
	return opNames[o]
}

// EnumName returns the upper-case RequestType member name.
func (o Op) EnumName() string { return strings.ToUpper(o.String()) }

// OpByName resolves an operation name sent as a string. It accepts the
// snake_case name and the upper-case RequestType member name.
func OpByName(name string) (Op, bool) {
	op, ok := opByName[strings.ToLower(name)]
	return op, ok
}

// Profile is one RequestType numbering.
type Profile struct {
	// Name is the --wire-profile value.
	Name string
	// ChunkSizeID is GET_CHUNK_SIZE's number: the fingerprint of the first
	// request on every client socket.
	ChunkSizeID int64
	// Ping is the type this generation's clients declare for PING's result.
	Ping PingType
	byID map[int64]Op
	ids  [opCount]int64
}

// Op maps a numeric op frame to an operation.
func (p *Profile) Op(id int64) (Op, bool) {
	op, ok := p.byID[id]
	return op, ok
}

// ID is the number of op in this profile (0, false if it has none).
func (p *Profile) ID(op Op) (int64, bool) {
	if op <= OpUnknown || op >= opCount || p.ids[op] == 0 {
		return 0, false
	}
	return p.ids[op], true
}

func newProfile(name string, ping PingType, table []Op) *Profile {
	p := &Profile{Name: name, Ping: ping, byID: make(map[int64]Op, len(table))}
	for i, op := range table {
		id := int64(i + 1) // enum.auto() starts at 1
		p.byID[id] = op
		p.ids[op] = id
		if op == OpGetChunkSize {
			p.ChunkSizeID = id
		}
	}
	return p
}

// Gen2M is the mainline RequestType table of the first engine-driven release
// line (research datapath.md 10.1).
var Gen2M = newProfile("gen2m", PingBool, []Op{
	OpRegisterKVCache, OpUnregisterKVCache, OpStore, OpRetrieve, OpLookup,
	OpQueryPrefetchStatus, OpQueryPrefetchLookupHits, OpFreeLookupLocks, OpEndSession,
	OpRegisterEngineDriven, OpUnregisterEngineDriven, OpPrepareStore, OpCommitStore,
	OpPrepareRetrieve, OpCommitRetrieve, OpClear, OpGetChunkSize, OpPing,
	OpReportBlockAllocation, OpNoop,
	OpCBRegisterKVCache, OpCBUnregisterKVCache, OpCBStorePreComputed, OpCBLookupPreComputed,
	OpCBRetrievePreComputed, OpCBStoreFinal, OpCBLookupPreComputedV2, OpCBRetrievePreComputedV2,
})

// Gen3 is the frozen legacy-id table of the operation-name generation; the
// late RequestType enum has the same values for 1-24.
var Gen3 = newProfile("gen3", PingStatus, []Op{
	OpRegisterKVCache, OpUnregisterKVCache, OpRegisterQCache, OpUnregisterQCache, OpStoreQ,
	OpStore, OpRetrieve, OpLookup, OpQueryPrefetchStatus, OpWaitPrefetchStatus,
	OpQueryPrefetchLookupHits, OpFreeLookupLocks, OpEndSession, OpRegisterEngineDriven,
	OpUnregisterEngineDriven, OpPrepareStore, OpCommitStore, OpPrepareRetrieve,
	OpCommitRetrieve, OpClear, OpGetChunkSize, OpPing, OpReportBlockAllocation, OpNoop,
	OpCBRegisterRope, OpCBUnregisterRope, OpCBRetrievePreComputed, OpCBUnifiedLookup,
	OpP2PLookupAndLock, OpP2PQueryLookupResults, OpP2PUnlockObjects, OpGetExperimental,
	OpCBProtocolHandshake, OpPollKVEvents,
})

// Others returns the supported numberings other than p, in fingerprint
// order.
func (p *Profile) Others() []*Profile {
	out := make([]*Profile, 0, len(profiles)-1)
	for _, q := range profiles {
		if q != p {
			out = append(out, q)
		}
	}
	return out
}

// profiles lists the supported numberings, in fingerprint order.
var profiles = []*Profile{Gen2M, Gen3}

// ProfileByName resolves a --wire-profile value other than "auto".
func ProfileByName(name string) (*Profile, bool) {
	for _, p := range profiles {
		if p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// ProfileByChunkSizeID identifies a client generation from the op number of
// its first request, GET_CHUNK_SIZE.
func ProfileByChunkSizeID(id int64) (*Profile, bool) {
	for _, p := range profiles {
		if p.ChunkSizeID == id {
			return p, true
		}
	}
	return nil, false
}

// OpFrame is a decoded op frame: a number or a name.
type OpFrame struct {
	IsName bool
	ID     int64
	Name   string
}

// String is for logs.
func (f OpFrame) String() string {
	if f.IsName {
		return fmt.Sprintf("%q", f.Name)
	}
	return fmt.Sprint(f.ID)
}

// DecodeOpFrame parses an op frame: exactly one msgpack int or str.
func DecodeOpFrame(b []byte) (OpFrame, error) {
	if len(b) == 0 {
		return OpFrame{}, fmt.Errorf("empty op frame")
	}
	var f OpFrame
	var rest []byte
	var err error
	switch msgp.NextType(b) {
	case msgp.IntType, msgp.UintType:
		f.ID, rest, err = msgp.ReadInt64Bytes(b)
	case msgp.StrType:
		f.IsName = true
		f.Name, rest, err = msgp.ReadStringBytes(b)
	default:
		return OpFrame{}, fmt.Errorf("op frame is msgpack %s, want int or str", msgp.NextType(b))
	}
	if err != nil {
		return OpFrame{}, fmt.Errorf("op frame: %w", err)
	}
	if len(rest) != 0 {
		return OpFrame{}, fmt.Errorf("op frame has %d trailing bytes", len(rest))
	}
	return f, nil
}

// Resolve maps an op frame to an operation under profile p.
func (f OpFrame) Resolve(p *Profile) (Op, bool) {
	if f.IsName {
		return OpByName(f.Name)
	}
	return p.Op(f.ID)
}

// Arity is the accepted range of payload frames of an operation; the counts
// vary between client versions (END_SESSION 1-2, CLEAR 0-1, PING 0-1, ...).
type Arity struct{ Min, Max int }

var arities = map[Op]Arity{
	OpRegisterKVCache:         {1, 7},
	OpUnregisterKVCache:       {1, 1},
	OpStore:                   {4, 4},
	OpRetrieve:                {5, 5},
	OpLookup:                  {1, 2},
	OpQueryPrefetchStatus:     {1, 1},
	OpWaitPrefetchStatus:      {1, 2},
	OpQueryPrefetchLookupHits: {1, 1},
	OpFreeLookupLocks:         {1, 2},
	OpEndSession:              {1, 2},
	OpRegisterEngineDriven:    {1, 1},
	OpUnregisterEngineDriven:  {1, 1},
	OpPrepareStore:            {2, 2},
	OpCommitStore:             {3, 3},
	OpPrepareRetrieve:         {2, 2},
	OpCommitRetrieve:          {2, 2},
	OpClear:                   {0, 1},
	OpGetChunkSize:            {0, 0},
	OpPing:                    {0, 1},
	OpReportBlockAllocation:   {0, 3},
	OpNoop:                    {0, 0},
	OpGetExperimental:         {0, 0},
}

// ArityOf returns the accepted payload-frame counts of op; ops the server
// does not implement accept any count.
func ArityOf(op Op) Arity {
	if a, ok := arities[op]; ok {
		return a
	}
	return Arity{0, 1 << 30}
}
