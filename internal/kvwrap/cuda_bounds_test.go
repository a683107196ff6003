package kvwrap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// long appends n as LONG1 with 8 little-endian bytes, for values BININT's
// 32 bits cannot hold.
func (p *pk) long(n int64) *pk {
	p.b = append(p.b, 0x8a, 8)
	p.b = binary.LittleEndian.AppendUint64(p.b, uint64(n))
	return p
}

func (p *pk) bytes(b []byte) *pk {
	p.b = append(p.b, 'C', byte(len(b)))
	p.b = append(p.b, b...)
	return p
}

// cudaHandleFields are the integers of a _share_cuda_() 8-tuple.
type cudaHandleFields struct{ device, storageBytes, storageOffsetBytes, refOffset int64 }

// cudaWrapper is a CudaIPCWrapper pickle of a contiguous float16 view of
// shape at element offset off, with the handle's integers from h.
func cudaWrapper(shape []int, off int64, h cudaHandleFields) []byte {
	stride := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i] = acc
		acc *= shape[i]
	}
	p := &pk{}
	p.op(0x80, 4).global("lmcache.v1.multiprocess.custom_types", "CudaIPCWrapper").op(')', 0x81)
	p.op('}', '(')
	p.str("handle").op('(').long(h.device).bytes(bytes.Repeat([]byte{1}, 64)).long(h.storageBytes).long(h.storageOffsetBytes).
		bytes([]byte("/torch_refcount")).long(h.refOffset).bytes(bytes.Repeat([]byte{2}, 64)).op(0x88, 't')
	p.str("dtype").global("torch", "float16")
	p.str("shape").tuple(shape)
	p.str("stride").tuple(stride)
	p.str("storage_offset").long(off)
	p.str("device_uuid").str("GPU-1")
	p.op('u', 'b', '.')
	return p.b
}

// TestDecodeCUDAHandleBounds: the handle's sizes and offsets are checked
// as the shared-memory wrapper's are, before any backend sees them: none
// is negative, the storage's end fits an int64, and the view lies inside
// the storage (torch's set_() refuses one that does not). Before, all of
// these decoded, and kvcuda's own test, base + extent > size, wrapped
// for a storage near 2^63 and passed.
func TestDecodeCUDAHandleBounds(t *testing.T) {
	// [4, 8] float16 is 64 bytes.
	good := cudaHandleFields{device: 0, storageBytes: 64, storageOffsetBytes: 4096, refOffset: 8}
	w, err := Decode(cudaWrapper([]int{4, 8}, 0, good))
	if err != nil {
		t.Fatalf("a view filling its 64-byte storage: %v", err)
	}
	if w.CUDA.StorageBytes != 64 || w.CUDA.StorageOffsetBytes != 4096 || w.CUDA.RefCounterOffset != 8 {
		t.Fatalf("decoded handle %+v", w.CUDA)
	}
	cases := map[string]struct {
		off int64
		h   cudaHandleFields
	}{
		"negative device":             {0, cudaHandleFields{-1, 64, 0, 0}},
		"negative storage bytes":      {0, cudaHandleFields{0, -64, 4096, 0}},
		"negative storage offset":     {0, cudaHandleFields{0, 64, -4096, 0}},
		"negative ref-counter offset": {0, cudaHandleFields{0, 64, 0, -8}},
		"view one byte past storage":  {0, cudaHandleFields{0, 63, 0, 0}},
		"offset view past storage":    {1, cudaHandleFields{0, 64, 0, 0}},
		// 2^62 + (2^62 - 1) fits, but a view needing more than the
		// storage's 2^62 - 1 bytes made base + extent wrap in kvcuda.
		"view past a huge storage": {1 << 61, cudaHandleFields{0, 1<<62 - 1, 1 << 62, 0}},
		"storage end overflows":    {0, cudaHandleFields{0, 1 << 62, 1 << 62, 0}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := Decode(cudaWrapper([]int{4, 8}, c.off, c.h)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode of a 64-byte view at element %d, handle %+v: error %v; want ErrMalformed", c.off, c.h, err)
			}
		})
	}
}

// TestDecodeRawCUDAViewInsideAllocation: a RawCudaIPCWrapper's view must
// fit its _nbytes allocation, as a shared-memory view must fit nbytes.
func TestDecodeRawCUDAViewInsideAllocation(t *testing.T) {
	raw := func(nbytes int64) []byte {
		p := &pk{}
		p.op(0x80, 4).global("lmcache.v1.platform.cuda.ipc_wrapper", "RawCudaIPCWrapper").op(')', 0x81)
		p.op('}', '(')
		p.str("_ipc_handle_reserved").bytes(bytes.Repeat([]byte{3}, 64))
		p.str("_nbytes").long(nbytes)
		p.str("dtype").global("torch", "float16")
		p.str("shape").tuple([]int{4, 8})
		p.str("stride").tuple([]int{8, 1})
		p.str("storage_offset").int(0)
		p.str("device_uuid").str("GPU-1")
		p.op('u', 'b', '.')
		return p.b
	}
	if w, err := Decode(raw(64)); err != nil || w.NBytes != 64 {
		t.Fatalf("64-byte view of a 64-byte allocation: %+v %v", w, err)
	}
	if w, err := Decode(raw(63)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("64-byte view of a 63-byte allocation decoded (nbytes %d, error %v); want ErrMalformed", w.NBytes, err)
	}
}
