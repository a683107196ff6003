package wire

import (
	"errors"
	"runtime"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// TestHugeCountsRefusedBeforeAllocation: a frame of a few bytes whose
// array header claims 2^32-1 elements (array32 0xdd ffffffff) is refused
// with an error, and decoding it allocates under 1 MiB: the count is
// checked (msgp's limit in the generated decoders, the bytes left in the
// hand-written ones) before it sizes a slice. Without the checks these
// frames made the server allocate gigabytes (a fatal out-of-memory error
// here, which no recover catches).
func TestHugeCountsRefusedBeforeAllocation(t *testing.T) {
	huge := []byte{0xdd, 0xff, 0xff, 0xff, 0xff}
	field := func(name string, value []byte) []byte {
		b := msgp.AppendMapHeader(nil, 1)
		b = msgp.AppendString(b, name)
		return append(b, value...)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		dec   func([]byte) error
		limit bool // msgp.ErrLimitExceeded, not a short-input error
	}{
		{"BlockAllocationRecord.new_block_ids", field("new_block_ids", huge), func(b []byte) error {
			var r BlockAllocationRecord
			_, err := r.UnmarshalMsg(b)
			return err
		}, true},
		{"BlockAllocationRecord.new_token_ids", field("new_token_ids", huge), func(b []byte) error {
			var r BlockAllocationRecord
			_, err := r.UnmarshalMsg(b)
			return err
		}, true},
		{"Key.token_ids", field("token_ids", huge), func(b []byte) error {
			var k Key
			_, err := k.UnmarshalMsg(b)
			return err
		}, false},
		{"null_chunk_mask groups", huge, func(b []byte) error {
			_, err := (&Key{NullChunkMask: b}).NullChunks()
			return err
		}, false},
		{"null_chunk_mask flags", append([]byte{0x91}, huge...), func(b []byte) error {
			_, err := (&Key{NullChunkMask: b}).NullChunks()
			return err
		}, false},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := tc.dec(tc.frame)
		runtime.ReadMemStats(&after)
		allocated := after.TotalAlloc - before.TotalAlloc
		switch {
		case err == nil:
			t.Errorf("%s: %d-byte frame claiming 2^32-1 elements decoded", tc.name, len(tc.frame))
		case tc.limit && !errors.Is(err, msgp.ErrLimitExceeded):
			t.Errorf("%s: %v, want msgp.ErrLimitExceeded", tc.name, err)
		case !tc.limit && !errors.Is(err, msgp.ErrShortBytes):
			t.Errorf("%s: %v, want msgp.ErrShortBytes", tc.name, err)
		}
		if allocated > 1<<20 {
			t.Errorf("%s: %d bytes allocated to refuse a %d-byte frame", tc.name, allocated, len(tc.frame))
		}
	}
}

// TestNullChunkMaskGroupLimit: a null_chunk_mask of more KV groups than
// msgp's array limit is refused before its groups are allocated. Each nil
// group is one byte on the wire but a 24-byte slice header decoded, so
// without the limit a frame of N bytes allocated 24·N (a 100 MB frame,
// 2.4 GB), past the few tens of MiB the limit bounds a frame's decode to.
func TestNullChunkMaskGroupLimit(t *testing.T) {
	const groups = maxMaskLen + 1
	b := msgp.AppendArrayHeader(nil, groups)
	for range groups {
		b = msgp.AppendNil(b)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	mask, err := (&Key{NullChunkMask: b}).NullChunks()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, msgp.ErrLimitExceeded) {
		t.Errorf("%d nil groups: %d groups decoded, err %v; want msgp.ErrLimitExceeded", groups, len(mask), err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 1<<20 {
		t.Errorf("%d bytes allocated to refuse a %d-byte mask", allocated, len(b))
	}
	// At the limit it still decodes.
	b = msgp.AppendArrayHeader(nil, maxMaskLen)
	for range maxMaskLen {
		b = msgp.AppendNil(b)
	}
	if mask, err := (&Key{NullChunkMask: b}).NullChunks(); err != nil || len(mask) != maxMaskLen {
		t.Errorf("a mask of %d nil groups: %d groups, err %v", maxMaskLen, len(mask), err)
	}
}
