package kvwrap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// pk builds wrapper pickles opcode by opcode (protocol 4, no framing).
type pk struct{ b []byte }

func (p *pk) op(b ...byte) *pk { p.b = append(p.b, b...); return p }
func (p *pk) str(s string) *pk {
	p.b = append(p.b, 'X')
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	p.b = append(p.b, s...)
	return p
}
func (p *pk) int(n int) *pk {
	p.b = append(p.b, 'J')
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(n))
	return p
}
func (p *pk) global(mod, name string) *pk {
	p.b = append(p.b, 'c')
	p.b = append(p.b, mod+"\n"+name+"\n"...)
	return p
}
func (p *pk) tuple(vals []int) *pk {
	p.op('(')
	for _, v := range vals {
		p.int(v)
	}
	return p.op('t')
}

// cpuWrapper is a CpuShmTensorWrapper pickle with the given shape
// (contiguous), shm_name and extra state fields.
func cpuWrapper(shape []int, shm string, extra int) []byte {
	stride := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i] = acc
		acc *= shape[i]
	}
	n := acc * 2
	p := &pk{}
	p.op(0x80, 4).global("lmcache.v1.multiprocess.custom_types", "CpuShmTensorWrapper").op(')', 0x81)
	p.op('}', '(')
	p.str("shm_name").str(shm)
	p.str("nbytes").int(n)
	p.str("shape").tuple(shape)
	p.str("stride").tuple(stride)
	p.str("storage_offset").int(0)
	p.str("dtype").global("torch", "bfloat16")
	p.str("device_uuid").str("")
	for i := range extra {
		p.str(fmt.Sprintf("extra_%02d", i)).op('N')
	}
	p.op('u', 'b', '.')
	return p.b
}

// baseFields is the number of state fields cpuWrapper always sets.
const baseFields = 7

func TestBoundConstants(t *testing.T) {
	if MaxPickleBytes != 64*1024 || maxOpcodes != 4096 || maxMarkDepth != 8 || maxMemo != 1024 || MaxRank != 8 || maxStateKeys != 32 {
		t.Fatalf("bounds: bytes %d opcodes %d marks %d memo %d rank %d fields %d, want 65536 4096 8 1024 8 32",
			MaxPickleBytes, maxOpcodes, maxMarkDepth, maxMemo, MaxRank, maxStateKeys)
	}
}

// TestBuilderWrapperDecodes: the hand-built wrapper used by the bound tests
// is a valid one, so each refusal below is the bound's.
func TestBuilderWrapperDecodes(t *testing.T) {
	w, err := Decode(cpuWrapper([]int{2, 3, 4}, "/seg", 0))
	if err != nil {
		t.Fatal(err)
	}
	if w.Kind != KindCPUShm || w.ShmName != "seg" || w.NBytes != 48 || w.Dtype != "bfloat16" || len(w.Shape) != 3 {
		t.Fatalf("decoded %+v", w)
	}
}

// TestDecodeRefusesCallingOpcodes: opcodes that call, use the extension
// registry, persistent ids or out-of-band buffers are refused by the scan,
// naming the opcode.
func TestDecodeRefusesCallingOpcodes(t *testing.T) {
	ops := map[string]byte{
		"INST": 'i', "OBJ": 'o', "NEWOBJ_EX": 0x92, "REDUCE": 'R',
		"EXT1": 0x82, "EXT2": 0x83, "EXT4": 0x84,
		"PERSID": 'P', "BINPERSID": 'Q',
		"NEXT_BUFFER": 0x97, "READONLY_BUFFER": 0x98, "BYTEARRAY8": 0x96,
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			_, err := Decode([]byte{0x80, 5, 'N', op, '.'})
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("Decode error = %v, want ErrRefused", err)
			}
			if want := fmt.Sprintf("pickle opcode 0x%02x at byte 3", op); !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not name %q", err, want)
			}
		})
	}
}

func TestDecodeOpcodeLimit(t *testing.T) {
	// PROTO + n NONEs + STOP is n+2 opcodes.
	at := append(append([]byte{0x80, 4}, bytes.Repeat([]byte{'N'}, 4094)...), '.')
	if _, err := Decode(at); errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrRefused) {
		t.Fatalf("4096 opcodes: %v, want ErrRefused (not a wrapper), not ErrTooLarge", err)
	}
	over := append(append([]byte{0x80, 4}, bytes.Repeat([]byte{'N'}, 4095)...), '.')
	_, err := Decode(over)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 4096 pickle opcodes") {
		t.Fatalf("4097 opcodes: %v, want ErrTooLarge", err)
	}
}

func TestDecodeSizeAndMarkLimits(t *testing.T) {
	if _, err := Decode(make([]byte, 65536)); errors.Is(err, ErrTooLarge) {
		t.Fatalf("65536 bytes refused as too large: %v", err)
	}
	if _, err := Decode(make([]byte, 65537)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "65537 bytes (limit 65536)") {
		t.Fatalf("65537 bytes: %v", err)
	}
	marks := func(n int) []byte {
		return append(append(append([]byte{0x80, 4}, bytes.Repeat([]byte{'('}, n)...), bytes.Repeat([]byte{'t'}, n)...), '.')
	}
	if _, err := Decode(marks(8)); errors.Is(err, ErrTooLarge) {
		t.Fatalf("MARK depth 8 refused as too large: %v", err)
	}
	if _, err := Decode(marks(9)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "MARK nesting deeper than 8") {
		t.Fatalf("MARK depth 9: %v", err)
	}
}

func TestDecodeRankLimit(t *testing.T) {
	if w, err := Decode(cpuWrapper([]int{1, 1, 1, 1, 1, 1, 1, 2}, "seg", 0)); err != nil || len(w.Shape) != 8 {
		t.Fatalf("rank 8: %+v %v", w, err)
	}
	_, err := Decode(cpuWrapper([]int{1, 1, 1, 1, 1, 1, 1, 1, 2}, "seg", 0))
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "shape has rank 9 (limit 8)") {
		t.Fatalf("rank 9: %v", err)
	}
}

func TestDecodeStateFieldLimit(t *testing.T) {
	if _, err := Decode(cpuWrapper([]int{4}, "seg", 32-baseFields)); err != nil {
		t.Fatalf("32 fields: %v", err)
	}
	_, err := Decode(cpuWrapper([]int{4}, "seg", 33-baseFields))
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 32 state fields") {
		t.Fatalf("33 fields: %v", err)
	}
}

// TestShmNameLength: 255 bytes is the longest name, in ShmName and in a
// decoded wrapper (a leading "/" not counted by ShmName).
func TestShmNameLength(t *testing.T) {
	n255, n256 := strings.Repeat("a", 255), strings.Repeat("a", 256)
	if got, err := ShmName("/" + n255); err != nil || got != n255 {
		t.Fatalf("255 bytes: %q %v", got, err)
	}
	if _, err := ShmName(n256); !errors.Is(err, ErrMalformed) {
		t.Fatalf("256 bytes: %v, want ErrMalformed", err)
	}
	if w, err := Decode(cpuWrapper([]int{4}, n255, 0)); err != nil || w.ShmName != n255 {
		t.Fatalf("wrapper with a 255-byte name: %v", err)
	}
	if _, err := Decode(cpuWrapper([]int{4}, n256, 0)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "shm_name longer than 255 bytes") {
		t.Fatalf("wrapper with a 256-byte name: %v", err)
	}
}
