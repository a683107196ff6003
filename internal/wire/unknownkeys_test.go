package wire

import (
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// TestKeyUnknownKeysIgnoredMissingDefault: a key map with every field
// plus unknown keys (a scalar and a nested map, before and after known
// ones) decodes to the known fields; num_kv_readers 0 or absent reads as 1.
func TestKeyUnknownKeysIgnoredMissingDefault(t *testing.T) {
	b := msgp.AppendMapHeader(nil, 6)
	b = msgp.AppendString(b, "future_scalar")
	b = msgp.AppendInt64(b, 7)
	b = msgp.AppendString(b, "model_name")
	b = msgp.AppendString(b, "m")
	b = msgp.AppendString(b, "world_size")
	b = msgp.AppendInt64(b, 2)
	b = msgp.AppendString(b, "future_nested")
	b = msgp.AppendMapHeader(b, 1)
	b = msgp.AppendString(b, "a")
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendInt64(b, 1)
	b = msgp.AppendString(b, "x")
	b = msgp.AppendString(b, "request_id")
	b = msgp.AppendString(b, "r")
	b = msgp.AppendString(b, "num_kv_readers")
	b = msgp.AppendInt64(b, 0)
	var k Key
	if err := Unmarshal(b, &k); err != nil {
		t.Fatalf("key with unknown keys: %v", err)
	}
	if k.ModelName != "m" || k.WorldSize != 2 || k.RequestID != "r" || k.WorkerID.Valid || len(k.TokenIDs) != 0 ||
		k.Start != 0 || k.End != 0 || k.CacheSalt != "" || k.NumKVReaders != 0 || k.Readers() != 1 {
		t.Fatalf("decoded %+v (readers %d), want m/2/r with defaults and readers 1", k, k.Readers())
	}
	k.NumKVReaders = 3
	if k.Readers() != 3 {
		t.Fatalf("num_kv_readers 3 read as %d", k.Readers())
	}
}
