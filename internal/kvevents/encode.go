package kvevents

import (
	"encoding/binary"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// ExternalHash is the 64-bit block hash a vLLM router sees for a chunk
// hash: vLLM publishes int.from_bytes(h, "big") & (2**64 - 1) when
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on (its default), which is the
// last eight bytes read big-endian.
func ExternalHash(chunkHash []byte) uint64 {
	if len(chunkHash) >= 8 {
		return binary.BigEndian.Uint64(chunkHash[len(chunkHash)-8:])
	}
	var b [8]byte
	copy(b[8-len(chunkHash):], chunkHash)
	return binary.BigEndian.Uint64(b[:])
}

// AppendPollResult encodes a POLL_KV_EVENTS reply as upstream's msgspec
// dataclass does: a map of enabled, incarnation, next_cursor, lost and
// events, each record a map of seq, kind, medium, model_name,
// block_hashes (raw bytes), parent_block_hash (bytes or nil), token_ids
// and block_size.
func AppendPollResult(b []byte, enabled bool, incarnation, next int64, lost bool, recs []Record) []byte {
	b = msgp.AppendMapHeader(b, 5)
	b = msgp.AppendString(b, "enabled")
	b = msgp.AppendBool(b, enabled)
	b = msgp.AppendString(b, "incarnation")
	b = msgp.AppendInt64(b, incarnation)
	b = msgp.AppendString(b, "next_cursor")
	b = msgp.AppendInt64(b, next)
	b = msgp.AppendString(b, "lost")
	b = msgp.AppendBool(b, lost)
	b = msgp.AppendString(b, "events")
	b = msgp.AppendArrayHeader(b, uint32(len(recs)))
	for i := range recs {
		r := &recs[i]
		b = msgp.AppendMapHeader(b, 8)
		b = msgp.AppendString(b, "seq")
		b = msgp.AppendInt64(b, r.Seq)
		b = msgp.AppendString(b, "kind")
		b = msgp.AppendString(b, r.Kind)
		b = msgp.AppendString(b, "medium")
		b = msgp.AppendString(b, r.Medium)
		b = msgp.AppendString(b, "model_name")
		b = msgp.AppendString(b, r.Model)
		b = msgp.AppendString(b, "block_hashes")
		b = msgp.AppendArrayHeader(b, uint32(len(r.Hashes)))
		for _, h := range r.Hashes {
			b = msgp.AppendBytes(b, h)
		}
		b = msgp.AppendString(b, "parent_block_hash")
		if r.Parent == nil {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendBytes(b, r.Parent)
		}
		b = appendTokens(b, "token_ids", r.Tokens)
		b = msgp.AppendString(b, "block_size")
		b = msgp.AppendInt(b, r.BlockSize)
	}
	return b
}

// SizeHint is an upper bound of the encoded size of recs, so encoders
// allocate once: a uint32 token is at most 5 bytes, a hash 9 (int) or 34
// (bytes), plus the fixed keys of a record.
func SizeHint(recs []Record) int {
	n := 128
	for i := range recs {
		n += 192 + 5*len(recs[i].Tokens) + 34*(len(recs[i].Hashes)+1)
	}
	return n
}

func appendTokens(b []byte, name string, toks []uint32) []byte {
	b = msgp.AppendString(b, name)
	b = msgp.AppendArrayHeader(b, uint32(len(toks)))
	for _, t := range toks {
		b = msgp.AppendUint32(b, t)
	}
	return b
}

// AppendBatch encodes events as one vLLM KVEventBatch in the shape of
// vLLM's vllm/distributed/kv_events.py at 0181ea31 (msgspec Structs with
// omit_defaults, not array_like; events tagged under "type"): a map of ts,
// events and data_parallel_rank; BlockStored is a map of type,
// block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium
// and lora_name; BlockRemoved of type, block_hashes and medium. The
// fields vLLM gives defaults (extra_keys, group_idx, kv_cache_spec_*) are
// left out, as omit_defaults leaves them out. Hashes are ExternalHash
// values.
func AppendBatch(b []byte, ts time.Time, dpRank int, events []Record) []byte {
	b = msgp.AppendMapHeader(b, 3)
	b = msgp.AppendString(b, "ts")
	b = msgp.AppendFloat64(b, float64(ts.UnixNano())/1e9)
	b = msgp.AppendString(b, "events")
	n := 0
	for i := range events {
		if events[i].Kind == KindStored {
			n += len(events[i].Hashes)
		} else {
			n++
		}
	}
	b = msgp.AppendArrayHeader(b, uint32(n))
	for i := range events {
		r := &events[i]
		if r.Kind != KindStored {
			b = msgp.AppendMapHeader(b, 3)
			b = msgp.AppendString(b, "type")
			b = msgp.AppendString(b, "BlockRemoved")
			b = appendHashes(b, r.Hashes)
			b = msgp.AppendString(b, "medium")
			b = msgp.AppendString(b, r.Medium)
			continue
		}
		// A stored record covers one chunk; one BlockStored per chunk.
		for _, h := range r.Hashes {
			b = msgp.AppendMapHeader(b, 8)
			b = msgp.AppendString(b, "type")
			b = msgp.AppendString(b, "BlockStored")
			b = appendHashes(b, [][]byte{h})
			b = msgp.AppendString(b, "parent_block_hash")
			if r.Parent == nil {
				b = msgp.AppendNil(b)
			} else {
				b = msgp.AppendUint64(b, ExternalHash(r.Parent))
			}
			b = appendTokens(b, "token_ids", r.Tokens)
			b = msgp.AppendString(b, "block_size")
			b = msgp.AppendInt(b, r.BlockSize)
			b = msgp.AppendString(b, "lora_id")
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "medium")
			b = msgp.AppendString(b, r.Medium)
			b = msgp.AppendString(b, "lora_name")
			b = msgp.AppendNil(b)
		}
	}
	b = msgp.AppendString(b, "data_parallel_rank")
	b = msgp.AppendInt(b, dpRank)
	return b
}

func appendHashes(b []byte, hs [][]byte) []byte {
	b = msgp.AppendString(b, "block_hashes")
	b = msgp.AppendArrayHeader(b, uint32(len(hs)))
	for _, h := range hs {
		b = msgp.AppendUint64(b, ExternalHash(h))
	}
	return b
}
