package mqclient

import (
	"math"
	"testing"

	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestSlotOutsidePoolRefused: a slot the server describes must lie inside
// the mapped pool; offsets and lengths whose sum overflows int64 are
// refused with an error like any other out-of-range slot, never a panic.
func TestSlotOutsidePoolRefused(t *testing.T) {
	p := &Pool{mem: make([]byte, 16)}
	if b, err := p.Slot(wire.Slot{Offset: 4, Length: 12}); err != nil || len(b) != 12 || cap(b) != 12 {
		t.Fatalf("slot [4, +12) of a 16-byte pool: len %d cap %d, %v", len(b), cap(b), err)
	}
	for _, s := range []wire.Slot{
		{Offset: math.MaxInt64, Length: 1},
		{Offset: 1, Length: math.MaxInt64},
		{Offset: math.MaxInt64, Length: math.MaxInt64},
		{Offset: 8, Length: 9},
		{Offset: -1, Length: 1},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("slot [%d, +%d) panicked: %v", s.Offset, s.Length, r)
				}
			}()
			if b, err := p.Slot(s); err == nil {
				t.Errorf("slot [%d, +%d) accepted: %d bytes", s.Offset, s.Length, len(b))
			}
		}()
	}
}
