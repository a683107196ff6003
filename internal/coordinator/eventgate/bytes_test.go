package eventgate

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
)

// TestByteBoundResets: instance ids have no length limit, so the cursor
// maps are bounded by their ids' bytes as well as their count. Before, only
// the count was: 100,000 ids of a mebibyte each (bodies may be 64 MiB)
// would have pinned 100 GB.
func TestByteBoundResets(t *testing.T) {
	big := func(c byte) string { return strings.Repeat(string(c), 1<<20) }
	for _, door := range bothDoors(New(0)) {
		for i := range DefaultMaxStreamBytes >> 20 {
			if out := door.offer(big(byte('a' + i))); out.Reset {
				t.Fatalf("%s: id %d of 1 MiB reset the map", door.door, i)
			}
		}
		if out := door.offer(big('z')); !out.Reset || out.Verdict != Admitted {
			t.Fatalf("%s: the id past %d bytes = %+v, want admitted with a reset", door.door, DefaultMaxStreamBytes, out)
		}
		if door.cursor(big('a')) != nil || door.cursor(big('z')) == nil {
			t.Fatalf("%s: after the reset the first id is kept or the last is not", door.door)
		}
	}
}

// TestRestoreKeepsByteBound: a restored checkpoint counts its ids' bytes, so
// the bound holds after a restart too.
func TestRestoreKeepsByteBound(t *testing.T) {
	g := New(0)
	id := strings.Repeat("x", 1<<20)
	g.Offer(id, 1, 1, nil, nil)
	var e checkpoint.Encoder
	g.Capture(&e, nil)
	r := New(0)
	r.maxBytes = 1<<20 + 10
	d := checkpoint.NewDecoder(e.Payload())
	if err := d.Sections(map[string]func(*checkpoint.Decoder){"gate": func(d *checkpoint.Decoder) { r.Restore(d) }}); err != nil {
		t.Fatal(err)
	}
	if s, _ := r.Stats(id); s == nil || r.gatedBytes != 1<<20 {
		t.Fatalf("restored %v with %d id bytes, want the stream and %d", s, r.gatedBytes, 1<<20)
	}
	if out := r.Offer("0123456789x", 1, 1, nil, nil); !out.Reset {
		t.Fatalf("offer past the restored bytes = %+v, want a reset", out)
	}
}
