// Package checkpoint is the coordinator's checkpoint artifact: derived state
// (the ledger's keys, sizes and LRU order, the event gate's cursors, the
// Kafka stream position) captured on a timer and at a clean stop, so a
// restart is warm without a resync.
//
// An artifact is a 24-byte header (the magic "LMCGOCKP", a little-endian
// uint32 version, a uint64 payload length and the payload's CRC-32C) and the
// payload: named sections, each a length-prefixed byte string, so a reader
// skips sections it does not know. It is written atomically (a temporary
// file in the same directory, fsync'd, renamed over the old one, and the
// directory fsync'd), so a crash leaves the previous artifact or the new
// one. Load verifies length, version and checksum before anything is
// decoded; any failure wraps ErrCorrupt and the caller moves the file aside
// and starts cold. The format is ours: upstream's checkpoint (a msgpack map
// of sections after an 8-byte magic) holds Python-side structures a Go
// coordinator does not have.
package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"time"

	"github.com/lmcache-go/lmcache/internal/atomicfile"
)

// Version is the artifact format version Load accepts.
const Version = 1

const (
	magic      = "LMCGOCKP"
	headerSize = 8 + 4 + 8 + 4
)

// ErrCorrupt wraps every reason an artifact that was read cannot be used:
// truncated, a bad checksum, another version, or a section that does not
// decode.
var ErrCorrupt = errors.New("corrupt checkpoint")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encoder appends a payload in memory: the capture runs under the ingest
// lock and must not wait on the disk.
type Encoder struct{ buf []byte }

// Uvarint appends v.
func (e *Encoder) Uvarint(v uint64) { e.buf = binary.AppendUvarint(e.buf, v) }

// Varint appends v.
func (e *Encoder) Varint(v int64) { e.buf = binary.AppendVarint(e.buf, v) }

// Bytes appends a length-prefixed byte string.
func (e *Encoder) Bytes(b []byte) { e.Uvarint(uint64(len(b))); e.buf = append(e.buf, b...) }

// String appends a length-prefixed string.
func (e *Encoder) String(s string) { e.Uvarint(uint64(len(s))); e.buf = append(e.buf, s...) }

// Bool appends b.
func (e *Encoder) Bool(b bool) {
	if b {
		e.buf = append(e.buf, 1)
	} else {
		e.buf = append(e.buf, 0)
	}
}

// Section appends one named section whose body fill writes.
func (e *Encoder) Section(name string, fill func(*Encoder)) {
	e.String(name)
	var body Encoder
	fill(&body)
	e.Bytes(body.buf)
}

// Payload is the bytes appended so far (aliased, not copied).
func (e *Encoder) Payload() []byte { return e.buf }

// Len is the payload's size so far.
func (e *Encoder) Len() int { return len(e.buf) }

// Decoder reads a payload. The first malformed read records an error
// wrapping ErrCorrupt; later reads return zero values, so callers check Err
// once at the end.
type Decoder struct {
	b   []byte
	off int
	err error
}

// NewDecoder reads b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

func (d *Decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: malformed %s at byte %d", ErrCorrupt, what, d.off)
	}
}

// Err is the first decoding error.
func (d *Decoder) Err() error { return d.err }

// Failf records a semantic error (a value out of range) at the current
// position.
func (d *Decoder) Failf(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s at byte %d", ErrCorrupt, fmt.Sprintf(format, args...), d.off)
	}
}

// Done reports whether every byte was read.
func (d *Decoder) Done() bool { return d.err != nil || d.off >= len(d.b) }

// Uvarint reads one.
func (d *Decoder) Uvarint() uint64 { return readVar(d, "uvarint", binary.Uvarint) }

// Varint reads one.
func (d *Decoder) Varint() int64 { return readVar(d, "varint", binary.Varint) }

func readVar[T uint64 | int64](d *Decoder, what string, read func([]byte) (T, int)) T {
	if d.err != nil {
		return 0
	}
	v, n := read(d.b[d.off:])
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.off += n
	return v
}

// Count reads a uvarint element count, refusing one larger than the bytes
// left could hold at minSize bytes per element (a corrupt count must not
// make the caller allocate gigabytes).
func (d *Decoder) Count(minSize int) int {
	n := d.Uvarint()
	if d.err == nil && n > uint64(len(d.b)-d.off)/uint64(max(minSize, 1)) {
		d.fail("count")
		return 0
	}
	return int(n)
}

// Bytes reads a length-prefixed byte string; the result aliases the payload.
func (d *Decoder) Bytes() []byte {
	n := d.Uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("byte string")
		return nil
	}
	out := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return out
}

// Raw reads n bytes (whose length the caller read itself); the result
// aliases the payload.
func (d *Decoder) Raw(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail("bytes")
		return nil
	}
	out := d.b[d.off : d.off+n]
	d.off += n
	return out
}

// Rest reads every byte left (a whole section, for comparing two).
func (d *Decoder) Rest() []byte { return d.Raw(len(d.b) - d.off) }

// String reads a length-prefixed string.
func (d *Decoder) String() string { return string(d.Bytes()) }

// Bool reads one.
func (d *Decoder) Bool() bool {
	if d.err != nil {
		return false
	}
	if d.off >= len(d.b) || d.b[d.off] > 1 {
		d.fail("bool")
		return false
	}
	d.off++
	return d.b[d.off-1] == 1
}

// Sections reads every section, handing each known one (by name) to its
// reader with a decoder over the section's bytes; unknown sections are
// skipped. A reader must consume its whole section.
func (d *Decoder) Sections(readers map[string]func(*Decoder)) error {
	for !d.Done() {
		name := d.String()
		body := d.Bytes()
		if d.err != nil {
			break
		}
		read, ok := readers[name]
		if !ok {
			continue
		}
		sd := NewDecoder(body)
		read(sd)
		if sd.err == nil && !sd.Done() {
			sd.Failf("%d unread bytes", len(sd.b)-sd.off)
		}
		if sd.err != nil {
			return fmt.Errorf("section %s: %w", name, sd.err)
		}
	}
	return d.err
}

// Save writes payload to path atomically and durably (atomicfile.Write;
// a failed directory fsync is atomicfile.ErrNotDurable).
func Save(path string, e *Encoder) error {
	hdr := make([]byte, headerSize)
	copy(hdr, magic)
	binary.LittleEndian.PutUint32(hdr[8:], Version)
	binary.LittleEndian.PutUint64(hdr[12:], uint64(len(e.buf)))
	binary.LittleEndian.PutUint32(hdr[20:], crc32.Checksum(e.buf, castagnoli))
	if err := atomicfile.Write(path, hdr, e.buf); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// Load reads and verifies the artifact at path and returns a decoder over
// its payload. A missing file is os.ErrNotExist (a first start, not an
// error); every integrity failure wraps ErrCorrupt.
func Load(path string) (*Decoder, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if len(b) < headerSize || string(b[:8]) != magic {
		return nil, fmt.Errorf("%w %s: not a checkpoint (no header)", ErrCorrupt, path)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != Version {
		return nil, fmt.Errorf("%w %s: version %d, want %d", ErrCorrupt, path, v, Version)
	}
	n := binary.LittleEndian.Uint64(b[12:])
	if n > math.MaxInt || n != uint64(len(b)-headerSize) {
		return nil, fmt.Errorf("%w %s: truncated (payload %d bytes, header says %d)", ErrCorrupt, path, len(b)-headerSize, n)
	}
	payload := b[headerSize:]
	if sum := crc32.Checksum(payload, castagnoli); sum != binary.LittleEndian.Uint32(b[20:]) {
		return nil, fmt.Errorf("%w %s: checksum %08x, header says %08x", ErrCorrupt, path, sum, binary.LittleEndian.Uint32(b[20:]))
	}
	return NewDecoder(payload), nil
}

// MoveAside renames a bad artifact to path.corrupt-<UTC time>, keeping it for
// inspection, and returns the new name.
func MoveAside(path string, now time.Time) (string, error) {
	aside := fmt.Sprintf("%s.corrupt-%s", path, now.UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("checkpoint: move %s aside: %w", path, err)
	}
	return aside, nil
}
