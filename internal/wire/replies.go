package wire

import (
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// Canonical single-value response frames.
var (
	// Nil is the response frame of a void request (None). Older clients need
	// a frame; newer ones accept an explicit nil.
	Nil = []byte{0xc0}
	// True and False are msgpack booleans.
	True  = []byte{0xc3}
	False = []byte{0xc2}
	// OK is NOOP's "OK".
	OK = []byte{0xa2, 'O', 'K'}
	// EmptyList is GET_EXPERIMENTAL's reply: no experimental capabilities.
	EmptyList = []byte{0x90}
	// EmptyMap is an empty context.
	EmptyMap = []byte{0x80}
)

// EncodeInt is a response frame holding one integer.
func EncodeInt(v int64) []byte { return AppendInt(nil, v) }

// EncodeBool is a response frame holding one bool.
func EncodeBool(v bool) []byte {
	if v {
		return True
	}
	return False
}

// Marshal encodes one msgp value into a fresh frame.
func Marshal(v msgp.Marshaler) []byte {
	b, err := v.MarshalMsg(nil)
	if err != nil {
		// Generated marshalers only fail on values that cannot be encoded
		// (none of ours hold such values).
		panic(fmt.Sprintf("wire: marshal %T: %v", v, err))
	}
	return b
}

// Unmarshal decodes exactly one msgp value from frame; trailing bytes are an
// error because a frame holds one value.
func Unmarshal(frame []byte, v msgp.Unmarshaler) error {
	rest, err := v.UnmarshalMsg(frame)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%d trailing bytes after %T", len(rest), v)
	}
	return nil
}

// EncodeStoreReply builds a PREPARE_STORE reply with SHM slots.
func EncodeStoreReply(slots []Slot, chunkIndices []Int) []byte {
	if slots == nil {
		slots = []Slot{}
	}
	if chunkIndices == nil {
		chunkIndices = []Int{}
	}
	ctx := Marshal(&StoreContext{Slots: slots, ChunkIndices: chunkIndices})
	return Marshal(&PrepareStoreResponse{Context: ctx})
}

// EncodeRetrieveReply builds a successful PREPARE_RETRIEVE reply.
func EncodeRetrieveReply(slots []Slot) []byte {
	ctx := Marshal(&RetrieveContext{Slots: slots})
	return Marshal(&PrepareRetrieveResponse{Success: true, Data: []byte{}, Context: ctx})
}

// NegativeReply is the well-formed refusal of op, of the type its client
// expects: the client sees a failure instead of waiting for a timeout.
func NegativeReply(op Op) []byte {
	switch op {
	case OpStore, OpRetrieve:
		return Marshal(&TransferReply{Handle: []byte{}, OK: false})
	case OpCommitStore, OpCommitRetrieve, OpPing:
		return False
	case OpPrepareStore:
		// No slots: the SHM client skips the chunks (they are recomputed
		// later). An empty context would make it gather into temporary
		// tensors and send a COMMIT_STORE whose data is lost anyway
		// (research datapath.md 10.2).
		return EncodeStoreReply(nil, nil)
	case OpPrepareRetrieve:
		return Marshal(&PrepareRetrieveResponse{Success: false, Data: []byte{}, Context: EmptyMap})
	case OpQueryPrefetchStatus, OpQueryPrefetchLookupHits, OpWaitPrefetchStatus:
		return EncodeInt(0)
	case OpNoop:
		return OK
	case OpGetExperimental:
		return EmptyList
	}
	return Nil
}

// PingType is the result type a client generation declares for PING.
type PingType int

const (
	// PingBool: a msgpack bool, always True, which gen2m-table clients
	// declare (protocols/controller.py "Returns: bool - Always True").
	// Whether that era's mq.py coerces bool/int replies was not
	// established (the strict decoders read are Gen-0), and a bool is
	// safe either way, so they get nothing else.
	PingBool PingType = iota
	// PingStatus: a msgpack int. Clients of the frozen gen3 table declare
	// PING as bool (transport/base.py@0ae94145), as int 1 healthy / 2
	// untracked-must-re-register (controller.py, index id 67504672474) or
	// as int boot token (controller.py, index id 68715968892), and decode
	// bool and int replies through bool()/int() coercion (mq.py
	// msgspec_decode, index id 68897429930). One int serves all three:
	// the server's boot token (never 1 or 2) when the sender is tracked
	// or is an untracked prober (nil instance id), PingUntracked when the
	// named instance is not registered. A bool client reads both as True;
	// a 1/2 client re-registers on 2 only; a boot-token client sees the
	// token change on a restart, and on 2.
	PingStatus
)

// PingUntracked is PING's answer to a worker whose instance is not (any
// more) registered: upstream's PING_UNTRACKED.
const PingUntracked = 2

// EncodePing is PING's reply for a client declaring t. tracked is false
// only for a worker instance id the server does not know (reaped, or the
// server restarted); bootToken identifies this server process.
func EncodePing(t PingType, tracked bool, bootToken int64) []byte {
	if t == PingBool {
		return True
	}
	if !tracked {
		return EncodeInt(PingUntracked)
	}
	return EncodeInt(bootToken)
}

// AppendOptString encodes a `str | None` into a raw value.
func AppendOptString(b []byte, s string, present bool) []byte {
	if !present {
		return msgp.AppendNil(b)
	}
	return msgp.AppendString(b, s)
}

// IsNilOrAbsent reports whether a raw optional field was not sent or was nil.
func IsNilOrAbsent(r msgp.Raw) bool { return len(r) == 0 || msgp.IsNil(r) }

// arrayLen is the length of a raw array value; nil or absent counts as 0.
func arrayLen(r msgp.Raw) (int, error) {
	if IsNilOrAbsent(r) {
		return 0, nil
	}
	n, _, err := msgp.ReadArrayHeaderBytes(r)
	return int(n), err
}

// MapLen is the number of entries of a raw map value; nil or absent counts as 0.
func MapLen(r msgp.Raw) (int, error) {
	if IsNilOrAbsent(r) {
		return 0, nil
	}
	n, _, err := msgp.ReadMapHeaderBytes(r)
	return int(n), err
}

// maxMaskLen bounds null_chunk_mask's groups: the limit the generated
// decoders apply to arrays (//msgp:limit in types.go).
const maxMaskLen = 1 << 20

// NullChunkMask decodes the key's null_chunk_mask (per KV group, per chunk;
// true = the chunk is backed only by the engine's null block). Absent or nil
// means every chunk is real.
func (k *Key) NullChunks() ([][]bool, error) {
	if IsNilOrAbsent(k.NullChunkMask) {
		return nil, nil
	}
	b := []byte(k.NullChunkMask)
	ng, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, fmt.Errorf("null_chunk_mask: %w", err)
	}
	// Each element takes at least one byte: a count beyond the bytes left
	// is refused before it sizes an allocation. A nil group is one byte
	// but a 24-byte slice header decoded, so the count is also held to
	// the generated decoders' array limit.
	if uint64(ng) > uint64(len(b)) {
		return nil, fmt.Errorf("null_chunk_mask: %d groups in %d bytes: %w", ng, len(b), msgp.ErrShortBytes)
	}
	if ng > maxMaskLen {
		return nil, fmt.Errorf("null_chunk_mask: %d groups: %w", ng, msgp.ErrLimitExceeded)
	}
	out := make([][]bool, ng)
	for g := range out {
		if msgp.IsNil(b) {
			b = b[1:]
			continue
		}
		var n uint32
		n, b, err = msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return nil, fmt.Errorf("null_chunk_mask[%d]: %w", g, err)
		}
		if uint64(n) > uint64(len(b)) {
			return nil, fmt.Errorf("null_chunk_mask[%d]: %d flags in %d bytes: %w", g, n, len(b), msgp.ErrShortBytes)
		}
		out[g] = make([]bool, n)
		for i := range out[g] {
			out[g][i], b, err = msgp.ReadBoolBytes(b)
			if err != nil {
				return nil, fmt.Errorf("null_chunk_mask[%d][%d]: %w", g, i, err)
			}
		}
	}
	return out, nil
}

// Readers is num_kv_readers with 0 (field absent, older client) read as 1.
func (k *Key) Readers() int {
	if k.NumKVReaders < 1 {
		return 1
	}
	return int(k.NumKVReaders)
}

// Hybrid reports whether a registration describes a multi-group model,
// which this server does not serve (research datapath.md 10.2).
func (p *RegisterPayload) Hybrid() (bool, string) {
	if n, err := arrayLen(p.EngineGroupInfos); err != nil || n > 1 {
		return true, fmt.Sprintf("%d engine_group_infos", n)
	}
	if p.EnableL1KVWeaveQuant {
		return true, "enable_l1_kvweave_quant"
	}
	if !IsNilOrAbsent(p.GroupLayoutDescs) {
		b := []byte(p.GroupLayoutDescs)
		n, b, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return true, "undecodable group_layout_descs"
		}
		for i := uint32(0); i < n; i++ {
			if !msgp.IsNil(b) {
				return true, "group_layout_descs"
			}
			b = b[1:]
		}
	}
	return false, ""
}
