package ledger

import (
	"encoding/binary"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Checkpoint export and import (the coordinator's --checkpoint-path). The
// section holds the model names, then per salt its name and its keys from
// least to most recently used, each with its size; pins are operator intent
// and live in the state file, in-flight marks are not kept (a restarted
// coordinator may re-send a victim once).
//
// Entry layout: model id, rank, then either an inline hash (length 0..32,
// the bytes, the group id) or, for the rare key that is not inline, the
// length 255 and its long name (the group's 8 bytes and the raw hash).

// AppendCheckpoint writes the ledger's keys, sizes and per-salt LRU order.
// It holds the ledger's lock for the whole capture; the caller quiesces
// ingest around it so the section matches the gate cursors beside it.
func (l *Ledger) AppendCheckpoint(e *checkpoint.Encoder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Uvarint(uint64(len(l.models)))
	for _, m := range l.models {
		e.String(m)
	}
	e.Uvarint(uint64(len(l.salts)))
	for _, s := range l.salts {
		e.String(s.name)
		e.Uvarint(uint64(s.count))
		for i := s.head; i != nilIdx; {
			en := l.at(i)
			c := &en.k
			e.Uvarint(uint64(c.model))
			e.Varint(c.rank)
			if c.hlen == longHash {
				e.Uvarint(longHash)
				e.String(l.longs[binary.LittleEndian.Uint32(c.hash[:4])])
			} else {
				e.Bytes(c.hash[:c.hlen])
				e.Uvarint(uint64(c.group))
			}
			e.Varint(en.size)
			i = en.next
		}
	}
}

// LoadCheckpoint adds the keys of a section AppendCheckpoint wrote, in its
// LRU order, to l (an empty ledger, apart from pins). It returns how many
// keys it stored; decoding errors are left in d.
func (l *Ledger) LoadCheckpoint(d *checkpoint.Decoder) int {
	nModels := d.Count(1)
	models := make([]string, nModels)
	for i := range models {
		models[i] = d.String()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	stored := 0
	nSalts := d.Count(1)
	for s := 0; s < nSalts && d.Err() == nil; s++ {
		salt := d.String()
		if err := objkey.ValidateSalt(salt); err != nil {
			d.Failf("salt %q: %v", salt, err)
			return stored
		}
		n := d.Count(4)
		for j := 0; j < n && d.Err() == nil; j++ {
			model := d.Uvarint()
			rank := d.Varint()
			var k Key
			if hl := d.Uvarint(); hl == longHash {
				name := d.String()
				if len(name) < 8 {
					d.Failf("long key name of %d bytes", len(name))
					return stored
				}
				k = FromObjectKey(objkey.Key{ChunkHash: name[8:], ObjectGroupID: int64(binary.LittleEndian.Uint64([]byte(name[:8])))})
			} else {
				if hl > inlineMax {
					d.Failf("hash of %d bytes", hl)
					return stored
				}
				// The length was read; the bytes follow.
				raw := d.Raw(int(hl))
				k.hlen = copy(k.hash[:], raw)
				k.Group = int64(d.Uvarint())
			}
			size := d.Varint()
			if d.Err() != nil {
				return stored
			}
			if model >= uint64(len(models)) || size < 0 || rank < 0 {
				d.Failf("entry with model %d of %d, rank %d, size %d", model, len(models), rank, size)
				return stored
			}
			k.Model, k.Salt, k.Rank = models[model], salt, rank
			l.store(&k, size)
			stored++
		}
	}
	return stored
}

// ReplacePins sets the pin counts to exactly pins, dropping every other pin
// (undoing a pin change whose state-file write failed).
func (l *Ledger) ReplacePins(pins []PinCount) {
	l.mu.Lock()
	clear(l.pins)
	l.mu.Unlock()
	l.RestorePins(pins)
}
