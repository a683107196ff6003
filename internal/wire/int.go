package wire

import (
	"fmt"
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

// MarshalMsg implements msgp.Marshaler.
func (t TokenIDs) MarshalMsg(b []byte) ([]byte, error) {
	b = msgp.AppendArrayHeader(b, uint32(len(t)))
	b = slices.Grow(b, 5*len(t)) // every id up to uint32 fits: no regrowth
	for _, v := range t {
		// AppendInt's forms, inlined (a call per id was a third of the
		// encoding time); TestTokenIDsMatchesGenericArray holds them equal.
		switch {
		case v < 0 || v > 0xffffffff:
			b = AppendInt(b, int64(v))
		case v < 0x80:
			b = append(b, byte(v))
		case v <= 0xff:
			b = append(b, 0xcc, byte(v))
		case v <= 0xffff:
			b = append(b, 0xcd, byte(v>>8), byte(v))
		default:
			b = append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
		}
	}
	return b, nil
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
	for i := range ids {
		// The forms token ids take inline; anything else (negative,
		// 64-bit, not an integer, too short) goes through Int.
		if len(rest) >= 5 {
			switch c := rest[0]; {
			case c < 0x80:
				ids[i], rest = Int(c), rest[1:]
				continue
			case c == 0xcc:
				ids[i], rest = Int(rest[1]), rest[2:]
				continue
			case c == 0xcd:
				ids[i], rest = Int(uint16(rest[1])<<8|uint16(rest[2])), rest[3:]
				continue
			case c == 0xce:
				ids[i], rest = Int(uint32(rest[1])<<24|uint32(rest[2])<<16|uint32(rest[3])<<8|uint32(rest[4])), rest[5:]
				continue
			}
		}
		if rest, err = ids[i].UnmarshalMsg(rest); err != nil {
			*t = ids[:0]
			return b, msgp.WrapError(err, i)
		}
	}
	*t = ids
	return rest, nil
}

// Msgsize implements msgp.Sizer.
func (t TokenIDs) Msgsize() int { return msgp.ArrayHeaderSize + len(t)*msgp.Int64Size }
