package wire

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// Int is a signed integer that encodes the way msgspec and Python's msgpack
// do: a non-negative value takes the smallest *unsigned* form (0xcc..0xcf),
// a negative one the smallest signed form. tinylib/msgp's own int64 encoder
// uses signed forms for positive values (256 becomes d1 0100, not cd 0100),
// which decodes fine in Python but breaks byte-for-byte golden frames.
//
// It lives outside the msgp-generated files so the generator treats it as an
// opaque type that implements the msgp interfaces itself.
type Int int64

// MarshalMsg implements msgp.Marshaler.
func (i Int) MarshalMsg(b []byte) ([]byte, error) { return AppendInt(b, int64(i)), nil }

// UnmarshalMsg implements msgp.Unmarshaler; it accepts every integer form and
// rejects an unsigned value above MaxInt64 instead of wrapping it.
func (i *Int) UnmarshalMsg(b []byte) ([]byte, error) {
	// Fast paths for the forms token ids take (a 32k-token key is 32k of
	// them): positive fixint and uint8/16/32. Everything else, and every
	// short buffer, goes through msgp, which also produces the errors.
	if len(b) >= 5 {
		switch c := b[0]; {
		case c < 0x80:
			*i = Int(c)
			return b[1:], nil
		case c == 0xcc:
			*i = Int(b[1])
			return b[2:], nil
		case c == 0xcd:
			*i = Int(uint16(b[1])<<8 | uint16(b[2]))
			return b[3:], nil
		case c == 0xce:
			*i = Int(uint32(b[1])<<24 | uint32(b[2])<<16 | uint32(b[3])<<8 | uint32(b[4]))
			return b[5:], nil
		}
	}
	v, o, err := msgp.ReadInt64Bytes(b)
	if err != nil {
		return b, err
	}
	*i = Int(v)
	return o, nil
}

// Msgsize implements msgp.Sizer.
func (i Int) Msgsize() int { return msgp.Int64Size }

// AppendInt appends v in msgspec's integer form (see Int).
func AppendInt(b []byte, v int64) []byte {
	// The forms up to uint32 by hand (a 32k-token key is 32k of them;
	// about 40 % faster than msgp's general encoder), byte-identical to
	// msgp's (TestIntFastPaths).
	switch {
	case v < 0:
		return msgp.AppendInt64(b, v)
	case v < 0x80:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return append(b, 0xcd, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return msgp.AppendUint64(b, uint64(v))
}

// OptInt is an integer that may be nil (Python `int | None`), as PING's and
// the key's worker_id.
type OptInt struct {
	Valid bool
	V     int64
}

// SomeInt returns a present OptInt.
func SomeInt(v int64) OptInt { return OptInt{Valid: true, V: v} }

// MarshalMsg implements msgp.Marshaler.
func (o OptInt) MarshalMsg(b []byte) ([]byte, error) {
	if !o.Valid {
		return msgp.AppendNil(b), nil
	}
	return AppendInt(b, o.V), nil
}

// UnmarshalMsg implements msgp.Unmarshaler.
func (o *OptInt) UnmarshalMsg(b []byte) ([]byte, error) {
	if msgp.IsNil(b) {
		*o = OptInt{}
		return b[1:], nil
	}
	v, rest, err := msgp.ReadInt64Bytes(b)
	if err != nil {
		return b, err
	}
	*o = OptInt{Valid: true, V: v}
	return rest, nil
}

// Msgsize implements msgp.Sizer.
func (o OptInt) Msgsize() int { return msgp.Int64Size }

// String is for logs.
func (o OptInt) String() string {
	if !o.Valid {
		return "None"
	}
	return fmt.Sprint(o.V)
}

// TokenIDs is a key's token id array. It encodes exactly as []Int (an
// array header, then each id in Int's form) but decodes and encodes in one
// loop without a call per element: a 32k-token key is 32k of them, on
// every LOOKUP, FREE_LOOKUP_LOCKS, PREPARE and COMMIT.
type TokenIDs []Int

// The id forms of a token array, as tables so that the loops below do not
// branch on each id's form: token values are spread over 1 to 5 bytes
// (a vocabulary of 128k ids puts about half of them on each side of
// 65536), and a branch per id mispredicted half of the time cost more than
// the copying. Every form up to uint32 is read and written as one 8-byte
// big-endian word: the tag in the top byte, the value right after it.
var (
	// Indexed by bits.Len32(v): the word's tag bits, the value's shift
	// in the word and the form's length.
	encTag   [33]uint64
	encShift [33]uint8
	encLen   [33]uint8
	// Indexed by the first byte: the form's length (0: not one of these
	// forms), the value's shift in the word and its mask.
	decLen   [256]uint8
	decShift [256]uint8
	decMask  [256]uint64
)

func init() {
	form := func(tag uint64, n uint8) (uint64, uint8, uint8) {
		if n == 1 {
			return 0, 56, 1 // positive fixint: the value is the tag byte
		}
		return tag << 56, 64 - 8*n, n
	}
	for l := range encLen {
		switch {
		case l <= 7:
			encTag[l], encShift[l], encLen[l] = form(0, 1)
		case l == 8:
			encTag[l], encShift[l], encLen[l] = form(0xcc, 2)
		case l <= 16:
			encTag[l], encShift[l], encLen[l] = form(0xcd, 3)
		default:
			encTag[l], encShift[l], encLen[l] = form(0xce, 5)
		}
	}
	for c := range 0x80 {
		decLen[c], decShift[c], decMask[c] = 1, 56, 0x7f
	}
	for c, n := range map[byte]uint8{0xcc: 2, 0xcd: 3, 0xce: 5} {
		decLen[c], decShift[c], decMask[c] = n, 64-8*n, 1<<(8*(n-1))-1
	}
}

// MarshalMsg implements msgp.Marshaler.
func (t TokenIDs) MarshalMsg(b []byte) ([]byte, error) {
	b = msgp.AppendArrayHeader(b, uint32(len(t)))
	// Every id up to uint32 fits in 5 bytes, and each is written as an
	// 8-byte word: 3 bytes of slack past the last one.
	b = slices.Grow(b, 5*len(t)+3)
	buf, pos := b[:cap(b)], len(b)
	for i, v := range t {
		if v < 0 || v > 0xffffffff {
			// AppendInt's other forms; then room for the rest again.
			b = slices.Grow(AppendInt(buf[:pos], int64(v)), 5*(len(t)-i-1)+3)
			buf, pos = b[:cap(b)], len(b)
			continue
		}
		l := bits.Len32(uint32(v))
		binary.BigEndian.PutUint64(buf[pos:], encTag[l]|uint64(v)<<encShift[l])
		pos += int(encLen[l])
	}
	return buf[:pos], nil
}

// UnmarshalMsg implements msgp.Unmarshaler. It decodes into t's backing
// array when that is large enough (as the generated code does for a
// []Int), so a caller can pass a reused buffer.
func (t *TokenIDs) UnmarshalMsg(b []byte) ([]byte, error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, err
	}
	// Every element is at least one byte: a header claiming more than
	// the frame holds is refused before anything is allocated.
	if uint64(n) > uint64(len(rest)) {
		return b, msgp.ErrShortBytes
	}
	ids := *t
	if cap(ids) >= int(n) {
		ids = ids[:n]
	} else {
		ids = make([]Int, n)
	}
	done, pos := decodeSplit(rest, ids)
	for i := done; i < len(ids); i++ {
		// The forms token ids take, read as one word while 8 bytes
		// remain; anything else (negative, 64-bit, not an integer, the
		// last few bytes) goes through Int, which also makes the errors.
		if len(rest)-pos >= 8 {
			if c := rest[pos]; decLen[c] != 0 {
				w := binary.BigEndian.Uint64(rest[pos:])
				ids[i] = Int(w >> decShift[c] & decMask[c])
				pos += int(decLen[c])
				continue
			}
		}
		tail, err := ids[i].UnmarshalMsg(rest[pos:])
		if err != nil {
			*t = ids[:0]
			return b, msgp.WrapError(err, i)
		}
		pos = len(rest) - len(tail)
	}
	*t = ids
	return rest[pos:], nil
}

// Msgsize implements msgp.Sizer.
func (t TokenIDs) Msgsize() int { return msgp.ArrayHeaderSize + len(t)*msgp.Int64Size }
