package l1

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestMakeRoomCountsOnlyNewBuffers: MakeRoom asks for the bytes the
// following Reserve of the same tag will allocate, not for every key of
// the batch. Keys the tag already stages under a live lease, a key
// repeated in the batch and a key whose cleared staging buffer the tag
// takes over need no new buffer, so a full pool gives up exactly one
// object for the one new key (before, such a batch evicted one object per
// key, or nothing at all and failed when fewer were evictable).
func TestMakeRoomCountsOnlyNewBuffers(t *testing.T) {
	const slot = 4 * kib
	for _, tc := range []struct {
		name  string
		setup func(tb *Table) // the test then fills the pool with resident objects
		batch []objkey.Key
	}{
		{
			// Two requests of one worker (one tag) sharing a prefix: the
			// second's PREPARE_STORE repeats the first's staged keys.
			name: "staged by the tag",
			setup: func(tb *Table) {
				if _, err := tb.Reserve("w", keyRange(0, 2), sizes(2, slot)); err != nil {
					t.Fatal(err)
				}
			},
			batch: keyRange(0, 3),
		},
		{
			name:  "repeated key",
			setup: func(tb *Table) { store(t, tb, keyRange(10, 12)) },
			batch: []objkey.Key{key(2), key(2), key(2)},
		},
		{
			name: "cleared buffer taken over",
			setup: func(tb *Table) {
				if _, err := tb.Reserve("w", keyRange(0, 2), sizes(2, slot)); err != nil {
					t.Fatal(err)
				}
				tb.Clear()
			},
			batch: keyRange(0, 3),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTable(4*slot, eviction.LRUName)
			tc.setup(tb)
			for i := 100; tb.alloc.Used() < tb.alloc.Total(); i++ {
				store(t, tb, []objkey.Key{key(i)})
			}
			evicted, bytes := tb.MakeRoom("w", tc.batch, sizes(len(tc.batch), slot))
			if len(evicted) != 1 || bytes != slot {
				t.Fatalf("MakeRoom evicted %v (%d bytes), want one object (%d bytes) for the one new key", evicted, bytes, slot)
			}
			if _, err := tb.Reserve("w", tc.batch, sizes(len(tc.batch), slot)); err != nil {
				t.Fatalf("Reserve after MakeRoom: %v", err)
			}
			tb.Abort("w", tc.batch)
		})
	}
}
