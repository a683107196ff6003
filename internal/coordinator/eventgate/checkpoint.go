package eventgate

import (
	"slices"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
)

// Capture writes both doors' cursors to e and then runs also (the state the
// cursors describe: the ledger, the stream position) while still holding the
// gate's lock, so no batch is admitted in between: the checkpoint's cursors
// and state agree, and a replay after restoring it is deduplicated exactly.
func (g *Gate) Capture(e *checkpoint.Encoder, also func(*checkpoint.Encoder)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e.Section("gate", func(e *checkpoint.Encoder) {
		for _, m := range []map[string]*cursor{g.gated, g.legacy} {
			e.Uvarint(uint64(len(m)))
			// Sorted, so equal gates write equal bytes.
			ids := make([]string, 0, len(m))
			for id := range m {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			for _, id := range ids {
				c := m[id]
				e.String(id)
				s := c.StreamStats
				e.Varint(s.Incarnation)
				e.Varint(s.LastSeq)
				e.Bool(s.GapDetected)
				for _, v := range []int64{s.Applied, s.Duplicates, s.Stale, s.Gaps, s.Fences} {
					e.Varint(v)
				}
			}
		}
	})
	if also != nil {
		also(e)
	}
}

// Restore reads a "gate" section Capture wrote into g, replacing its
// cursors. It returns how many streams it restored; errors stay in d.
func (g *Gate) Restore(d *checkpoint.Decoder) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	doors := []struct {
		m       *map[string]*cursor
		idBytes *int
	}{{&g.gated, &g.gatedBytes}, {&g.legacy, &g.legacyBytes}}
	for _, door := range doors {
		count := d.Count(9)
		fresh := make(map[string]*cursor, min(count, g.max))
		idBytes := 0
		for i := 0; i < count && d.Err() == nil; i++ {
			id := d.String()
			var s StreamStats
			s.Incarnation, s.LastSeq, s.GapDetected = d.Varint(), d.Varint(), d.Bool()
			for _, v := range []*int64{&s.Applied, &s.Duplicates, &s.Stale, &s.Gaps, &s.Fences} {
				*v = d.Varint()
			}
			if len(fresh) < g.max && idBytes+len(id) <= g.maxBytes {
				fresh[id] = &cursor{s}
				idBytes += len(id)
			}
		}
		*door.m, *door.idBytes = fresh, idBytes
		n += len(fresh)
	}
	return n
}
