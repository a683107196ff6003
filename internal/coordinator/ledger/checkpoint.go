package ledger

import (
	"encoding/binary"
	"slices"
	"strings"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Checkpoint export and import (the coordinator's --checkpoint-path). The
// section holds the model names, then per salt its name and its keys from
// least to most recently used (its parked keys first, see saltState), each
// with its size; pins are operator intent
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
	// Models and salts are written sorted by name (ids renumbered), so two
	// ledgers with the same keys, sizes and per-salt LRU order write the
	// same bytes whatever order they first saw the names in.
	// Only models some key uses are written (a restore interns no other).
	used := make([]bool, len(l.models.list))
	for _, s := range l.salts {
		for _, ls := range s.inOrder() {
			for i := ls.head; i != nilIdx; i = l.at(i).next {
				used[l.at(i).k.model] = true
			}
		}
	}
	var models []string
	for i, m := range l.models.list {
		if used[i] {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	remap := make([]uint64, len(l.models.list))
	for i, m := range l.models.list {
		j, _ := slices.BinarySearch(models, m)
		remap[i] = uint64(j)
	}
	e.Uvarint(uint64(len(models)))
	for _, m := range models {
		e.String(m)
	}
	// A salt without keys (all deleted, or only pinned) is left out: it
	// holds no derived state, and a restore would not recreate it.
	salts := slices.DeleteFunc(slices.Clone(l.salts), func(s *saltState) bool { return s.count == 0 })
	slices.SortFunc(salts, func(a, b *saltState) int { return strings.Compare(a.name, b.name) })
	e.Uvarint(uint64(len(salts)))
	for _, s := range salts {
		e.String(s.name)
		e.Uvarint(uint64(s.count))
		for _, ls := range s.inOrder() {
			l.appendList(e, ls, remap)
		}
	}
}

// appendList writes the entries of ls in order; must hold mu.
func (l *Ledger) appendList(e *checkpoint.Encoder, ls *list, remap []uint64) {
	for i := ls.head; i != nilIdx; {
		en := l.at(i)
		c := &en.k
		e.Uvarint(remap[c.model])
		e.Varint(c.rank)
		if c.hlen == longHash {
			e.Uvarint(longHash)
			e.String(l.longs.list[binary.LittleEndian.Uint32(c.hash[:4])])
		} else {
			e.Bytes(c.hash[:c.hlen])
			e.Uvarint(uint64(c.group))
		}
		e.Varint(en.size)
		i = en.next
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
	defer l.sweepNames()
	stored := 0
	nSalts := d.Count(1)
	for s := 0; s < nSalts && d.Err() == nil; s++ {
		salt := d.String()
		if err := objkey.ValidateSalt(salt); err != nil {
			d.Failf("salt %q: %v", salt, err)
			return stored
		}
		n := d.Count(4)
		// The pinned keys at the least recent end are parked as they
		// arrive, as the first plan would park them, so it does not walk
		// them all (under the lock) after every restart. A pinned key
		// after the first unpinned one keeps its LRU place: parked, its
		// unpin would make it the least recent.
		leading := len(l.pins) > 0
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
			if leading {
				leading = l.parkNewestIfPinned(&k)
			}
		}
	}
	return stored
}

// parkNewestIfPinned moves k, just stored (so the most recent key of its
// salt's lru), to the salt's parked list if it is pinned, and reports
// whether it was; must hold mu.
func (l *Ledger) parkNewestIfPinned(k *Key) bool {
	c, ok := l.lookupKey(k)
	if !ok {
		return false
	}
	s := l.salts[c.salt]
	i := s.lru.tail
	if i == nilIdx {
		return false
	}
	e := l.at(i)
	if e.k != c || l.pins[c] <= 0 {
		return false
	}
	l.unlink(s, i, e)
	e.sent |= parkedBit
	l.pushTail(&s.parked, i, e)
	return true
}

// ReplacePins sets the pin counts to exactly pins, dropping every other pin
// (undoing a pin change whose state-file write failed).
func (l *Ledger) ReplacePins(pins []PinCount) {
	l.mu.Lock()
	for c := range l.pins {
		l.release(&c)
	}
	clear(l.pins)
	// Parked keys must be pinned; the next plan parks again those that
	// pins still holds. This path is rare (a failed state-file write).
	l.unparkAll()
	l.mu.Unlock()
	l.RestorePins(pins)
}
