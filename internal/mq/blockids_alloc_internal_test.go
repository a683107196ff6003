package mq

import (
	"runtime"
	"slices"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// TestDecodeBlockIDsBoundedAllocation: gpu_block_ids allocates in
// proportion to the ids it holds, not to the counts its headers claim or
// to its empty groups: a 6-byte frame claiming 2^20 ids, and a 1 MiB
// frame of 2^20 empty groups behind the first (one byte each, a 24-byte
// slice header each when kept), allocate under 1 MiB; the ids of the
// first group still come back.
func TestDecodeBlockIDsBoundedAllocation(t *testing.T) {
	claim := msgp.AppendArrayHeader(msgp.AppendArrayHeader(nil, 1), maxBlockIDs)
	const groups = 1 << 20
	empty := msgp.AppendArrayHeader(nil, groups)
	empty = msgp.AppendInt64(msgp.AppendArrayHeader(empty, 1), 7)
	for range groups - 1 {
		empty = msgp.AppendArrayHeader(empty, 0)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want []int64
		ok   bool
	}{
		{"2^20 ids claimed", claim, nil, false},
		{"2^20 empty groups", empty, []int64{7}, true},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		got, err := decodeBlockIDs(tc.in)
		runtime.ReadMemStats(&after)
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v (ok %v)", tc.name, got, err, tc.want, tc.ok)
		}
		if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 1<<20 {
			t.Errorf("%s: %d bytes allocated to decode a %d-byte frame", tc.name, allocated, len(tc.in))
		}
	}
}
