// Package kvwrap decodes the pickled KV-cache tensor wrappers that an
// LMCache client sends in REGISTER_KV_CACHE (msgpack ext type 1): the CPU
// shared-memory wrapper (CpuShmTensorWrapper) and the CUDA IPC wrappers
// (CudaIPCWrapper / DeviceIPCWrapper, RawCudaIPCWrapper).
//
// Upstream unpickles these with plain pickle.loads, which runs whatever
// the pickle names. Here nothing is executed: the opcode stream is first
// checked against a short allow-list (no REDUCE, no INST/OBJ, no
// extensions), then github.com/nlpodyssey/gopickle builds plain Go values
// with a class resolver that knows only the wrapper classes (any module
// under "lmcache.", matched by class name, because the module moved
// between releases) and torch's dtype globals. Every other global is
// refused with ErrRefused, and the resulting state is type-checked field
// by field.
//
// Field sets follow LMCache's wrappers as read at commits 36f20944,
// 1e67847b (lmcache/v1/platform/cpu/shm.py) and fe40747d
// (lmcache/v1/platform/backends/cpu/shm.py): shm_name, nbytes (or the
// oldest _nbytes), handle, dtype, shape, stride, storage_offset,
// device_uuid.
package kvwrap

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"

	"github.com/lmcache-go/lmcache/internal/overflow"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// Errors returned by Decode; each is wrapped with the detail.
var (
	// ErrRefused: the pickle names a global or uses an instruction that is
	// not allowed (anything but the wrapper classes and torch dtypes).
	ErrRefused = errors.New("kv wrapper pickle refused")
	// ErrMalformed: the pickle is not a well-formed wrapper.
	ErrMalformed = errors.New("malformed kv wrapper pickle")
	// ErrTooLarge: the pickle exceeds a size or nesting bound.
	ErrTooLarge = errors.New("kv wrapper pickle too large")
)

// Kind is which wrapper class a pickle held.
type Kind int

const (
	// KindCPUShm is CpuShmTensorWrapper: the tensor lives in a POSIX
	// shared-memory segment.
	KindCPUShm Kind = iota + 1
	// KindCUDAIPC is CudaIPCWrapper / DeviceIPCWrapper: torch's CUDA IPC
	// storage handle.
	KindCUDAIPC
	// KindRawCUDAIPC is RawCudaIPCWrapper: a bare cudaIpcMemHandle_t for
	// non-torch allocations.
	KindRawCUDAIPC
)

// String names the kind the way logs and errors show it.
func (k Kind) String() string {
	switch k {
	case KindCPUShm:
		return "cpu_shm"
	case KindCUDAIPC:
		return "cuda_ipc"
	case KindRawCUDAIPC:
		return "raw_cuda_ipc"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// classKinds maps the wrapper class names to kinds. DeviceIPCWrapper is
// the base class newer clients may name for CUDA tensors.
var classKinds = map[string]Kind{
	"CpuShmTensorWrapper": KindCPUShm,
	"CudaIPCWrapper":      KindCUDAIPC,
	"DeviceIPCWrapper":    KindCUDAIPC,
	"RawCudaIPCWrapper":   KindRawCUDAIPC,
}

// MaxRank bounds a wrapped tensor's rank (vLLM's layouts are rank 3 to 6).
const MaxRank = 8

// Wrapper is one decoded tensor wrapper: the tensor's element type and
// strided view, plus where its memory is.
type Wrapper struct {
	Kind Kind
	// Class is the pickled "module.qualname".
	Class string
	// Dtype is the torch dtype name ("bfloat16", "float8_e4m3fn", ...).
	Dtype string
	// ItemSize is Dtype's element size in bytes.
	ItemSize int64
	// Shape and Stride (in elements) describe the view.
	Shape, Stride []int64
	// StorageOffset is the view's first element within its storage.
	StorageOffset int64
	// DeviceUUID is "cpu" for shared memory, the GPU UUID string for CUDA.
	DeviceUUID string

	// ShmName is the shared-memory segment name without the leading "/"
	// (KindCPUShm), checked to be a single path element.
	ShmName string
	// NBytes is the segment length to map (KindCPUShm), or the raw
	// allocation size (KindRawCUDAIPC).
	NBytes int64

	// CUDA holds the storage handle (KindCUDAIPC, KindRawCUDAIPC).
	CUDA *CUDAHandle
}

// CUDAHandle is torch's UntypedStorage._share_cuda_() 8-tuple, or the raw
// handle of a RawCudaIPCWrapper (only MemHandle set).
type CUDAHandle struct {
	Device             int64
	MemHandle          []byte
	StorageBytes       int64
	StorageOffsetBytes int64
	RefCounterHandle   []byte
	RefCounterOffset   int64
	EventHandle        []byte
	EventSyncRequired  bool
}

// Extent is the number of bytes from the start of the storage to the end
// of the view's last element: the mapping must be at least this long.
func (w Wrapper) Extent() (int64, error) {
	return extent(w.Shape, w.Stride, w.StorageOffset, w.ItemSize)
}

// Contiguous reports whether the view is row-major contiguous.
func (w Wrapper) Contiguous() bool {
	acc := int64(1)
	for i := len(w.Shape) - 1; i >= 0; i-- {
		if w.Shape[i] != 1 && w.Stride[i] != acc {
			return false
		}
		acc *= w.Shape[i]
	}
	return true
}

func extent(shape, stride []int64, off, item int64) (int64, error) {
	last := off
	for i, d := range shape {
		if d == 0 {
			return 0, nil
		}
		step, ok := overflow.Mul(d-1, stride[i])
		if !ok {
			return 0, fmt.Errorf("%w: view extent overflows", ErrMalformed)
		}
		if last, ok = overflow.Add(last, step); !ok {
			return 0, fmt.Errorf("%w: view extent overflows", ErrMalformed)
		}
	}
	// last+1 wraps only for last = MaxInt64, to a negative operand that
	// overflow.Mul refuses.
	n, ok := overflow.Mul(last+1, item)
	if !ok {
		return 0, fmt.Errorf("%w: view extent overflows", ErrMalformed)
	}
	return n, nil
}

// wrapperClass is the Go stand-in for a wrapper class global. NEWOBJ with
// an empty tuple makes a wrapperState; nothing else can be made from it.
type wrapperClass struct {
	module, name string
	kind         Kind
}

func (c *wrapperClass) PyNew(args ...any) (any, error) {
	if len(args) != 0 {
		return nil, fmt.Errorf("%w: %s.%s built with %d arguments", ErrMalformed, c.module, c.name, len(args))
	}
	return &wrapperState{class: c, fields: map[string]any{}}, nil
}

// maxStateKeys bounds the state dict (a wrapper has about eight fields).
const maxStateKeys = 32

// wrapperState collects the BUILD state dict of a wrapper instance.
type wrapperState struct {
	class  *wrapperClass
	fields map[string]any
}

func (s *wrapperState) PyDictSet(key, value any) error {
	k, ok := key.(string)
	if !ok {
		return fmt.Errorf("%w: state key %T is not a string", ErrMalformed, key)
	}
	if _, dup := s.fields[k]; !dup && len(s.fields) >= maxStateKeys {
		return fmt.Errorf("%w: more than %d state fields", ErrTooLarge, maxStateKeys)
	}
	s.fields[k] = value
	return nil
}

// dtypeGlobal is a torch dtype global such as torch.bfloat16: a plain
// value that can be neither called nor instantiated.
type dtypeGlobal struct{ name string }

func findClass(module, name string) (any, error) {
	if kind, ok := classKinds[name]; ok && (module == "lmcache" || strings.HasPrefix(module, "lmcache.")) {
		return &wrapperClass{module: module, name: name, kind: kind}, nil
	}
	if module == "torch" {
		if _, ok := wire.DtypeSize(name); ok {
			return &dtypeGlobal{name: name}, nil
		}
	}
	return nil, fmt.Errorf("%w: global %s.%s is not a kv wrapper class or torch dtype", ErrRefused, module, name)
}

// Decode decodes one wrapper pickle (the body of a msgpack ext-1 value).
// The input is never executed; see the package comment.
func Decode(p []byte) (w Wrapper, err error) {
	if len(p) > MaxPickleBytes {
		return Wrapper{}, fmt.Errorf("%w: %d bytes (limit %d)", ErrTooLarge, len(p), MaxPickleBytes)
	}
	if err := scan(p); err != nil {
		return Wrapper{}, err
	}
	// gopickle returns errors for malformed streams; this recover is a
	// second fence so a library panic on hostile input is an error too.
	defer func() {
		if r := recover(); r != nil {
			w, err = Wrapper{}, fmt.Errorf("%w: unpickler failed: %v", ErrMalformed, r)
		}
	}()
	u := pickle.NewUnpickler(bytes.NewReader(p))
	u.FindClass = findClass
	u.PersistentLoad = func(any) (any, error) {
		return nil, fmt.Errorf("%w: persistent ids", ErrRefused)
	}
	u.GetExtension = func(int) (any, error) { return nil, fmt.Errorf("%w: extension registry", ErrRefused) }
	u.NextBuffer = func() (any, error) { return nil, fmt.Errorf("%w: out-of-band buffers", ErrRefused) }
	v, err := u.Load()
	if err != nil {
		if errors.Is(err, ErrRefused) || errors.Is(err, ErrMalformed) || errors.Is(err, ErrTooLarge) {
			return Wrapper{}, err
		}
		return Wrapper{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	st, ok := v.(*wrapperState)
	if !ok {
		return Wrapper{}, fmt.Errorf("%w: pickle holds %s, not a kv wrapper", ErrRefused, describe(v))
	}
	return fromState(st)
}

func describe(v any) string {
	switch x := v.(type) {
	case *types.GenericObject:
		return "object of " + x.Class.Module + "." + x.Class.Name
	case nil:
		return "None"
	}
	return fmt.Sprintf("%T", v)
}

func fromState(st *wrapperState) (Wrapper, error) {
	f := st.fields
	w := Wrapper{Kind: st.class.kind, Class: st.class.module + "." + st.class.name}
	dt, ok := f["dtype"].(*dtypeGlobal)
	if !ok {
		return Wrapper{}, fmt.Errorf("%w: dtype is %s, want a torch dtype", ErrMalformed, describe(f["dtype"]))
	}
	w.Dtype = dt.name
	w.ItemSize, _ = wire.DtypeSize(dt.name)
	var err error
	if w.Shape, err = intTuple(f["shape"], "shape"); err != nil {
		return Wrapper{}, err
	}
	if w.Stride, err = intTuple(f["stride"], "stride"); err != nil {
		return Wrapper{}, err
	}
	if len(w.Shape) == 0 || len(w.Shape) != len(w.Stride) {
		return Wrapper{}, fmt.Errorf("%w: shape rank %d, stride rank %d", ErrMalformed, len(w.Shape), len(w.Stride))
	}
	for i := range w.Shape {
		if w.Shape[i] <= 0 || w.Stride[i] < 0 {
			return Wrapper{}, fmt.Errorf("%w: shape %v stride %v", ErrMalformed, w.Shape, w.Stride)
		}
	}
	if w.StorageOffset, err = intField(f, "storage_offset", true); err != nil {
		return Wrapper{}, err
	}
	if w.StorageOffset < 0 {
		return Wrapper{}, fmt.Errorf("%w: storage_offset %d", ErrMalformed, w.StorageOffset)
	}
	if w.DeviceUUID, err = strField(f, "device_uuid", 128); err != nil {
		return Wrapper{}, err
	}
	ext, err := w.Extent()
	if err != nil {
		return Wrapper{}, err
	}
	switch w.Kind {
	case KindCPUShm:
		name, err := strField(f, "shm_name", 255)
		if err != nil {
			return Wrapper{}, err
		}
		if w.ShmName, err = ShmName(name); err != nil {
			return Wrapper{}, err
		}
		key := "nbytes"
		if _, ok := f[key]; !ok {
			key = "_nbytes" // the oldest wrapper (custom_types)
		}
		if w.NBytes, err = intField(f, key, false); err != nil {
			return Wrapper{}, err
		}
		if ext > w.NBytes {
			return Wrapper{}, fmt.Errorf("%w: view needs %d bytes but the segment is %d", ErrMalformed, ext, w.NBytes)
		}
	case KindCUDAIPC:
		h, err := cudaHandle(f["handle"])
		if err != nil {
			return Wrapper{}, err
		}
		// The view indexes its storage, [StorageOffsetBytes,
		// +StorageBytes) of the allocation; torch's set_() refuses a view
		// past the storage's end, and so is one here, as for nbytes above.
		if ext > h.StorageBytes {
			return Wrapper{}, fmt.Errorf("%w: view needs %d bytes but the CUDA storage is %d", ErrMalformed, ext, h.StorageBytes)
		}
		w.CUDA = h
	case KindRawCUDAIPC:
		raw, ok := f["_ipc_handle_reserved"].([]byte)
		if !ok || len(raw) != 64 {
			return Wrapper{}, fmt.Errorf("%w: _ipc_handle_reserved must be 64 bytes", ErrMalformed)
		}
		if w.NBytes, err = intField(f, "_nbytes", false); err != nil {
			return Wrapper{}, err
		}
		if ext > w.NBytes {
			return Wrapper{}, fmt.Errorf("%w: view needs %d bytes but the allocation is %d", ErrMalformed, ext, w.NBytes)
		}
		w.CUDA = &CUDAHandle{MemHandle: bytes.Clone(raw)}
	}
	return w, nil
}

// ShmName checks a wrapper's segment name and returns it without the
// leading "/" (the shm_open spelling): it must then be one non-empty path
// element of at most 255 bytes with no "/", NUL or "..", so it can only
// name a file directly in the shared-memory directory.
func ShmName(name string) (string, error) {
	n := strings.TrimPrefix(name, "/")
	if n == "" || len(n) > 255 || strings.ContainsAny(n, "/\x00") || strings.Contains(n, "..") || n == "." {
		return "", fmt.Errorf("%w: shm_name %q is not a single segment name", ErrMalformed, name)
	}
	return n, nil
}

func cudaHandle(v any) (*CUDAHandle, error) {
	t, ok := v.(*types.Tuple)
	if !ok || t.Len() != 8 {
		return nil, fmt.Errorf("%w: CUDA handle is %s, want an 8-tuple", ErrMalformed, describe(v))
	}
	h := &CUDAHandle{}
	var err error
	ints := []*int64{&h.Device, nil, &h.StorageBytes, &h.StorageOffsetBytes, nil, &h.RefCounterOffset}
	for i, dst := range ints {
		if dst == nil {
			continue
		}
		if *dst, err = toInt(t.Get(i), fmt.Sprintf("handle[%d]", i)); err != nil {
			return nil, err
		}
		// A device ordinal, a size and two offsets: none is negative in
		// anything torch shares.
		if *dst < 0 {
			return nil, fmt.Errorf("%w: handle[%d] is %d", ErrMalformed, i, *dst)
		}
	}
	// Backends address the storage's end, offset + size: it must fit.
	if _, ok := overflow.Add(h.StorageOffsetBytes, h.StorageBytes); !ok {
		return nil, fmt.Errorf("%w: CUDA storage of %d bytes at offset %d ends past 2^63", ErrMalformed, h.StorageBytes, h.StorageOffsetBytes)
	}
	var okb bool
	if h.MemHandle, okb = t.Get(1).([]byte); !okb || len(h.MemHandle) != 64 {
		return nil, fmt.Errorf("%w: handle[1] must be the 64-byte cudaIpcMemHandle_t", ErrMalformed)
	}
	if h.RefCounterHandle, okb = t.Get(4).([]byte); !okb || len(h.RefCounterHandle) > 256 {
		return nil, fmt.Errorf("%w: handle[4] must be the ref-counter handle bytes", ErrMalformed)
	}
	if h.EventHandle, okb = t.Get(6).([]byte); !okb || (len(h.EventHandle) != 64 && len(h.EventHandle) != 0) {
		return nil, fmt.Errorf("%w: handle[6] must be the 64-byte cudaIpcEventHandle_t", ErrMalformed)
	}
	if h.EventSyncRequired, okb = t.Get(7).(bool); !okb {
		return nil, fmt.Errorf("%w: handle[7] must be a bool", ErrMalformed)
	}
	h.MemHandle = bytes.Clone(h.MemHandle)
	h.RefCounterHandle = bytes.Clone(h.RefCounterHandle)
	h.EventHandle = bytes.Clone(h.EventHandle)
	return h, nil
}

func intTuple(v any, what string) ([]int64, error) {
	t, ok := v.(*types.Tuple)
	if !ok {
		if l, isList := v.(*types.List); isList {
			t = (*types.Tuple)(l)
		} else {
			return nil, fmt.Errorf("%w: %s is %s, want a tuple of ints", ErrMalformed, what, describe(v))
		}
	}
	if t.Len() > MaxRank {
		return nil, fmt.Errorf("%w: %s has rank %d (limit %d)", ErrTooLarge, what, t.Len(), MaxRank)
	}
	out := make([]int64, t.Len())
	for i := range out {
		n, err := toInt(t.Get(i), what)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

func intField(f map[string]any, key string, zeroOK bool) (int64, error) {
	v, ok := f[key]
	if !ok {
		if zeroOK {
			return 0, nil
		}
		return 0, fmt.Errorf("%w: missing %s", ErrMalformed, key)
	}
	n, err := toInt(v, key)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: %s is %d", ErrMalformed, key, n)
	}
	return n, nil
}

func toInt(v any, what string) (int64, error) {
	switch x := v.(type) {
	case int:
		return int64(x), nil
	case bool:
		// Python bools are ints, but a bool where a size belongs is a bug.
		return 0, fmt.Errorf("%w: %s is a bool", ErrMalformed, what)
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), nil
		}
	}
	return 0, fmt.Errorf("%w: %s is %s, want an int below 2^63", ErrMalformed, what, describe(v))
}

func strField(f map[string]any, key string, limit int) (string, error) {
	s, ok := f[key].(string)
	if !ok {
		return "", fmt.Errorf("%w: %s is %s, want a string", ErrMalformed, key, describe(f[key]))
	}
	if len(s) > limit {
		return "", fmt.Errorf("%w: %s longer than %d bytes", ErrTooLarge, key, limit)
	}
	return s, nil
}
