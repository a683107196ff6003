package kvwrap

import (
	"encoding/binary"
	"fmt"
)

// Bounds on what a wrapper pickle may contain. A real wrapper is a few
// hundred bytes (one class global, a state dict of about eight entries,
// two short int tuples, a 64-byte CUDA handle or two); these limits are
// generous for that and small enough that a hostile pickle costs nothing.
const (
	// MaxPickleBytes is the largest wrapper pickle accepted.
	MaxPickleBytes = 64 << 10
	// maxOpcodes bounds the number of pickle instructions.
	maxOpcodes = 4096
	// maxMarkDepth bounds MARK nesting (tuples inside the state dict).
	maxMarkDepth = 8
	// maxMemo bounds memo indexes (BINPUT/LONG_BINPUT targets).
	maxMemo = 1024
)

// argKind says how an opcode's inline argument is laid out.
type argKind int

const (
	argNone argKind = iota
	argFixed
	argLen1 // 1-byte length, then that many bytes
	argLen4 // 4-byte little-endian length, then bytes
	argLen8 // 8-byte little-endian length, then bytes
	argLine2
	argFrame
)

type opInfo struct {
	name string
	kind argKind
	n    int // argument size for argFixed
}

// allowedOps are the only pickle instructions a wrapper needs: strings,
// bytes, small ints, tuples, a dict, None/bools, memo traffic, a class or
// dtype global, NEWOBJ and BUILD. Everything that calls a callable (REDUCE,
// INST, OBJ, NEWOBJ_EX), the extension registry, persistent ids and
// out-of-band buffers are absent, so they are refused before anything runs.
var allowedOps = map[byte]opInfo{
	0x80: {"PROTO", argFixed, 1},
	0x95: {"FRAME", argFrame, 8},
	0x8c: {"SHORT_BINUNICODE", argLen1, 0},
	'X':  {"BINUNICODE", argLen4, 0},
	0x8d: {"BINUNICODE8", argLen8, 0},
	'C':  {"SHORT_BINBYTES", argLen1, 0},
	'B':  {"BINBYTES", argLen4, 0},
	0x8e: {"BINBYTES8", argLen8, 0},
	0x94: {"MEMOIZE", argNone, 0},
	'q':  {"BINPUT", argFixed, 1},
	'r':  {"LONG_BINPUT", argFixed, 4},
	'h':  {"BINGET", argFixed, 1},
	'j':  {"LONG_BINGET", argFixed, 4},
	0x93: {"STACK_GLOBAL", argNone, 0},
	'c':  {"GLOBAL", argLine2, 0},
	')':  {"EMPTY_TUPLE", argNone, 0},
	0x85: {"TUPLE1", argNone, 0},
	0x86: {"TUPLE2", argNone, 0},
	0x87: {"TUPLE3", argNone, 0},
	't':  {"TUPLE", argNone, 0},
	'(':  {"MARK", argNone, 0},
	0x81: {"NEWOBJ", argNone, 0},
	'}':  {"EMPTY_DICT", argNone, 0},
	's':  {"SETITEM", argNone, 0},
	'u':  {"SETITEMS", argNone, 0},
	']':  {"EMPTY_LIST", argNone, 0},
	'a':  {"APPEND", argNone, 0},
	'e':  {"APPENDS", argNone, 0},
	'b':  {"BUILD", argNone, 0},
	'N':  {"NONE", argNone, 0},
	0x88: {"NEWTRUE", argNone, 0},
	0x89: {"NEWFALSE", argNone, 0},
	'J':  {"BININT", argFixed, 4},
	'K':  {"BININT1", argFixed, 1},
	'M':  {"BININT2", argFixed, 2},
	0x8a: {"LONG1", argLen1, 0},
	'.':  {"STOP", argNone, 0},
}

// scan walks the opcode stream without executing it and refuses anything
// outside allowedOps, any length that runs past the input, deep MARK
// nesting, large memo indexes and trailing bytes after STOP. The pickle
// library allocates an argument's declared length before reading it, so
// this check is what keeps a forged 8-byte length from allocating
// gigabytes.
func scan(p []byte) error {
	i, ops, depth := 0, 0, 0
	for {
		if i >= len(p) {
			return fmt.Errorf("%w: pickle ends without STOP", ErrMalformed)
		}
		op := p[i]
		info, ok := allowedOps[op]
		if !ok {
			return fmt.Errorf("%w: pickle opcode 0x%02x at byte %d", ErrRefused, op, i)
		}
		ops++
		if ops > maxOpcodes {
			return fmt.Errorf("%w: more than %d pickle opcodes", ErrTooLarge, maxOpcodes)
		}
		i++
		rest := len(p) - i
		switch info.kind {
		case argFixed, argFrame:
			if rest < info.n {
				return fmt.Errorf("%w: %s argument truncated", ErrMalformed, info.name)
			}
			switch op {
			case 0x80:
				if p[i] < 2 || p[i] > 5 {
					return fmt.Errorf("%w: pickle protocol %d (want 2..5)", ErrRefused, p[i])
				}
			case 'r', 'j':
				if binary.LittleEndian.Uint32(p[i:]) >= maxMemo {
					return fmt.Errorf("%w: memo index %d", ErrTooLarge, binary.LittleEndian.Uint32(p[i:]))
				}
			case 0x95:
				if binary.LittleEndian.Uint64(p[i:]) > uint64(rest-8) {
					return fmt.Errorf("%w: FRAME longer than the pickle", ErrMalformed)
				}
			}
			i += info.n
		case argLen1:
			if rest < 1 || int(p[i]) > rest-1 {
				return fmt.Errorf("%w: %s length runs past the pickle", ErrMalformed, info.name)
			}
			i += 1 + int(p[i])
		case argLen4:
			if rest < 4 || uint64(binary.LittleEndian.Uint32(p[i:])) > uint64(rest-4) {
				return fmt.Errorf("%w: %s length runs past the pickle", ErrMalformed, info.name)
			}
			i += 4 + int(binary.LittleEndian.Uint32(p[i:]))
		case argLen8:
			if rest < 8 || binary.LittleEndian.Uint64(p[i:]) > uint64(rest-8) {
				return fmt.Errorf("%w: %s length runs past the pickle", ErrMalformed, info.name)
			}
			i += 8 + int(binary.LittleEndian.Uint64(p[i:]))
		case argLine2:
			for range 2 {
				n := indexNewline(p[i:])
				if n < 0 {
					return fmt.Errorf("%w: GLOBAL name not terminated", ErrMalformed)
				}
				i += n + 1
			}
		}
		switch op {
		case '(':
			depth++
			if depth > maxMarkDepth {
				return fmt.Errorf("%w: MARK nesting deeper than %d", ErrTooLarge, maxMarkDepth)
			}
		case 't', 'u', 'e':
			// These consume the topmost MARK. An unbalanced stream is the
			// unpickler's to reject; the depth only has to stay bounded.
			if depth > 0 {
				depth--
			}
		case '.':
			if i != len(p) {
				return fmt.Errorf("%w: %d bytes after STOP", ErrMalformed, len(p)-i)
			}
			return nil
		}
	}
}

func indexNewline(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return -1
}
