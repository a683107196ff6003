package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// tokenSamples covers every integer form at its boundaries, positive and
// negative, so each lands at every offset of the fast loop's 5-byte guard.
var tokenSamples = []Int{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1, -1, -32, -33, -128, -129, -1 << 63, 150000, 7}

// TestTokenIDsMatchesGenericArray: TokenIDs encodes byte for byte as an
// array of Int the generic way (what the generated code did before it
// existed) and decodes that back to the same values, with a value after
// it left in place.
func TestTokenIDsMatchesGenericArray(t *testing.T) {
	for n := range len(tokenSamples) + 1 {
		ids := tokenSamples[:n]
		want := msgp.AppendArrayHeader(nil, uint32(len(ids)))
		for _, v := range ids {
			want = AppendInt(want, int64(v))
		}
		got, err := TokenIDs(ids).MarshalMsg(nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%d ids: encoded %x, %v; want %x", n, got, err, want)
		}
		var back TokenIDs
		rest, err := back.UnmarshalMsg(append(got, 0xc0))
		if err != nil || !slices.Equal(back, TokenIDs(ids)) || !bytes.Equal(rest, []byte{0xc0}) {
			t.Fatalf("%d ids: decoded %v, rest %x, %v", n, back, rest, err)
		}
	}
}

// TestTokenIDsReusesBuffer: a buffer with room is decoded into in place.
func TestTokenIDsReusesBuffer(t *testing.T) {
	buf := make(TokenIDs, 0, 64)
	frame, _ := TokenIDs(tokenSamples).MarshalMsg(nil)
	ids := buf
	if _, err := ids.UnmarshalMsg(frame); err != nil {
		t.Fatal(err)
	}
	if &ids[0] != &buf[:1][0] || len(ids) != len(tokenSamples) {
		t.Fatalf("decoded into a new array (len %d)", len(ids))
	}
}

// TestTokenIDsRefusesBadArrays: a header promising more ids than the frame
// has bytes is refused before allocating, a truncated id and a non-integer
// element are errors naming the element, never values.
func TestTokenIDsRefusesBadArrays(t *testing.T) {
	var ids TokenIDs
	huge := msgp.AppendArrayHeader(nil, 1<<31)
	if _, err := ids.UnmarshalMsg(append(huge, 1, 2, 3)); !errors.Is(err, msgp.ErrShortBytes) || cap(ids) != 0 {
		t.Fatalf("header of 2^31 ids over 3 bytes: %v, cap %d", err, cap(ids))
	}
	frame, _ := TokenIDs{1, 70000}.MarshalMsg(nil)
	if _, err := ids.UnmarshalMsg(frame[:len(frame)-1]); err == nil {
		t.Fatalf("truncated last id decoded as %v", ids)
	}
	notInt := append(msgp.AppendArrayHeader(nil, 2), 5, 0xa1, 'x', 0xc0, 0xc0, 0xc0)
	_, err := ids.UnmarshalMsg(notInt)
	if err == nil {
		t.Fatalf("a str element decoded as %v", ids)
	}
	if got, want := err.Error(), `msgp: attempted to decode type "str" with method for "int" at 1`; got != want {
		t.Fatalf("error %q, want %q", got, want)
	}
}

// BenchmarkTokenIDs32k: a 32k-token key's ids (token values below 150000,
// so mostly the 5-byte uint32 form; the -random cases draw them at random) encoded into a reused buffer and
// decoded into a reused array, by TokenIDs and, as the baseline in the
// same run, element by element through Int (what the generated code did).
func BenchmarkTokenIDs32k(b *testing.B) {
	ids := make(TokenIDs, 32768)
	for i := range ids {
		ids[i] = Int((3*1_000_003 + i*7919) % 150000)
	}
	// Ids drawn at random from a 128k vocabulary, as a real prompt's are:
	// their forms (3 or 5 bytes) follow no pattern a branch predictor
	// could learn.
	rnd := make(TokenIDs, len(ids))
	r := rand.New(rand.NewPCG(1, 2))
	for i := range rnd {
		rnd[i] = Int(r.IntN(128000))
	}
	frame, _ := ids.MarshalMsg(nil)
	rndFrame, _ := rnd.MarshalMsg(nil)
	buf := make([]byte, 0, len(frame))
	back := make(TokenIDs, 0, len(ids))
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			buf, _ = ids.MarshalMsg(buf[:0])
		}
	})
	b.Run("encode-per-int", func(b *testing.B) {
		for b.Loop() {
			buf = msgp.AppendArrayHeader(buf[:0], uint32(len(ids)))
			for _, v := range ids {
				buf, _ = v.MarshalMsg(buf)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			back = back[:0]
			if _, err := back.UnmarshalMsg(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode-random", func(b *testing.B) {
		for b.Loop() {
			buf, _ = rnd.MarshalMsg(buf[:0])
		}
	})
	b.Run("decode-random", func(b *testing.B) {
		for b.Loop() {
			back = back[:0]
			if _, err := back.UnmarshalMsg(rndFrame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-per-int", func(b *testing.B) {
		for b.Loop() {
			n, rest, _ := msgp.ReadArrayHeaderBytes(frame)
			back = back[:n]
			for i := range back {
				rest, _ = back[i].UnmarshalMsg(rest)
			}
		}
	})
}

// decodeGeneric decodes an id array element by element through Int, the
// way the generated code did before TokenIDs.
func decodeGeneric(b []byte) ([]Int, []byte, error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	if uint64(n) > uint64(len(rest)) {
		return nil, b, msgp.ErrShortBytes
	}
	ids := make([]Int, n)
	for i := range ids {
		if rest, err = ids[i].UnmarshalMsg(rest); err != nil {
			return nil, b, msgp.WrapError(err, i)
		}
	}
	return ids, rest, nil
}

// FuzzTokenIDsMatchesGeneric is differential: on any frame TokenIDs
// decodes exactly what the element-by-element decoder does (the same
// values and rest, or an error in both), and any values it is given
// (8 bytes each) encode byte for byte as AppendInt writes them.
func FuzzTokenIDsMatchesGeneric(f *testing.F) {
	frame, _ := TokenIDs(tokenSamples).MarshalMsg(nil)
	f.Add(frame)
	f.Add(append(msgp.AppendArrayHeader(nil, 3), 0xce, 0, 1, 0, 0, 0xcd))
	f.Add(append(msgp.AppendArrayHeader(nil, 2), 5, 0xa1, 'x', 0xc0))
	f.Fuzz(func(t *testing.T, data []byte) {
		want, wantRest, wantErr := decodeGeneric(data)
		var got TokenIDs
		rest, err := got.UnmarshalMsg(data)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("frame %x: TokenIDs err %v, generic err %v", data, err, wantErr)
		}
		if err == nil && (!slices.Equal(got, TokenIDs(want)) || !bytes.Equal(rest, wantRest)) {
			t.Fatalf("frame %x: TokenIDs %v rest %x, generic %v rest %x", data, got, rest, want, wantRest)
		}
		if err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("frame %x: TokenIDs err %q, generic err %q", data, err, wantErr)
		}
		vals := make(TokenIDs, len(data)/8)
		for i := range vals {
			vals[i] = Int(binary.LittleEndian.Uint64(data[8*i:]))
			if i%2 == 0 { // keep many in the 1-5 byte forms
				vals[i] &= 0x1ffff
			}
		}
		enc, _ := vals.MarshalMsg([]byte{0xc0})
		ref := msgp.AppendArrayHeader([]byte{0xc0}, uint32(len(vals)))
		for _, v := range vals {
			ref = AppendInt(ref, int64(v))
		}
		if !bytes.Equal(enc, ref) {
			t.Fatalf("values %v: encoded %x, want %x", vals, enc, ref)
		}
	})
}

// FuzzTokenIDsLongMatchesGeneric is FuzzTokenIDsMatchesGeneric for arrays
// long enough for the two-chain decode (decodeSplit): a prompt of 4,096 to
// 12,287 ids drawn from the fuzz input (a 128k vocabulary with ids of
// every other form mixed in where the input says), followed by arbitrary
// bytes, optionally with one byte replaced, decodes exactly as the
// element-by-element decoder decodes it.
func FuzzTokenIDsLongMatchesGeneric(f *testing.F) {
	f.Add(uint64(1), uint16(0), uint8(0), []byte{0xc0}, uint32(0), uint8(0))
	f.Add(uint64(7), uint16(8000), uint8(3), []byte{0xa1, 'x', 0xcd}, uint32(40000), uint8(0xce))
	f.Add(uint64(9), uint16(100), uint8(200), []byte{}, uint32(25000), uint8(0x00))
	f.Fuzz(func(t *testing.T, seed uint64, extra uint16, oddEvery uint8, after []byte, flipAt uint32, flipTo uint8) {
		r := rand.New(rand.NewPCG(seed, uint64(extra)))
		n := 4096 + int(extra)%8192
		odd := []Int{0, 5, 127, 128, 255, -1, -33, 1 << 32, 1<<63 - 1, 65535, 65536}
		ids := make([]Int, n)
		for i := range ids {
			ids[i] = Int(r.IntN(128000))
			if oddEvery != 0 && r.IntN(int(oddEvery)+8) == 0 {
				ids[i] = odd[r.IntN(len(odd))]
			}
		}
		frame := msgp.AppendArrayHeader(nil, uint32(n))
		for _, v := range ids {
			frame = AppendInt(frame, int64(v))
		}
		frame = append(frame, after...)
		if flipAt != 0 {
			frame[int(flipAt)%len(frame)] = flipTo
		}
		want, wantRest, wantErr := decodeGeneric(frame)
		var got TokenIDs
		rest, err := got.UnmarshalMsg(frame)
		if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
			t.Fatalf("%d ids: TokenIDs err %v, generic err %v", n, err, wantErr)
		}
		if err == nil && (!slices.Equal(got, TokenIDs(want)) || !bytes.Equal(rest, wantRest)) {
			i := 0
			for i < min(len(got), len(want)) && got[i] == want[i] {
				i++
			}
			t.Fatalf("%d ids: first difference at %d; rest %d bytes, want %d", n, i, len(rest), len(wantRest))
		}
		if flipAt == 0 && (err != nil || !slices.Equal(got, TokenIDs(ids))) {
			t.Fatalf("%d ids: the unmodified frame did not decode to its ids (%v)", n, err)
		}
	})
}

// TestDecodeSplitDoesTheBulk: on a 32k-id prompt of a 128k vocabulary
// the two-chain decode (not the plain loop after it) decodes all but a
// few hundred ids, exactly, and stops at an id boundary; on a prompt
// whose second half starts with a slow form it still decodes exactly
// what it claims.
func TestDecodeSplitDoesTheBulk(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ids := make(TokenIDs, 32768)
	for i := range ids {
		ids[i] = Int(r.IntN(128000))
	}
	for _, slowAt := range []int{-1, 16384, 16390} {
		in := slices.Clone(ids)
		if slowAt >= 0 {
			in[slowAt] = -5
		}
		frame, _ := in.MarshalMsg(nil)
		_, rest, _ := msgp.ReadArrayHeaderBytes(frame)
		out := make([]Int, len(in))
		done, pos := decodeSplit(rest, out)
		if slowAt < 0 && done < len(in)-1024 {
			t.Fatalf("two chains decoded %d of %d ids", done, len(in))
		}
		if !slices.Equal(out[:done], in[:done]) {
			t.Fatalf("slow id at %d: the %d ids decodeSplit claims differ", slowAt, done)
		}
		again, _ := TokenIDs(in[:done]).MarshalMsg(nil)
		if _, prefix, _ := msgp.ReadArrayHeaderBytes(again); pos != len(prefix) {
			t.Fatalf("slow id at %d: %d ids end at byte %d, decodeSplit says %d", slowAt, done, len(prefix), pos)
		}
		if slowAt >= 0 && done > slowAt {
			t.Fatalf("decodeSplit decoded past the slow id at %d (%d)", slowAt, done)
		}
	}
}
