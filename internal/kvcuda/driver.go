// Package kvcuda is the CUDA backend of the lmcache-driven data path: it
// opens the CUDA IPC memory handles a vLLM worker registered
// (CudaIPCWrapper / RawCudaIPCWrapper), waits on the worker's IPC event,
// and runs kvlayout copy plans between the paged GPU blocks and pinned L1
// host memory as batched asynchronous copies on its own stream, then
// records an interprocess event whose handle goes back to the worker.
//
// The CUDA driver API is reached through the Driver interface. LoadDriver
// binds libcuda.so.1 at run time with github.com/ebitengine/purego, so the
// binary builds and runs without CUDA (with or without cgo) and the path
// is enabled only where the driver loads and a device matches the
// wrapper's UUID. Fake is a Driver over host memory that records the call
// sequence, so the backend's logic is tested without a GPU.
//
// Status: built and tested against Fake; not yet run on a GPU.
package kvcuda

import (
	"errors"
	"strings"
	"unsafe"
)

// IPCHandle is a cudaIpcMemHandle_t or cudaIpcEventHandle_t (64 opaque
// bytes).
type IPCHandle [64]byte

// Driver-level handles, opaque to the backend.
type (
	// Context is a CUcontext.
	Context uintptr
	// Stream is a CUstream.
	Stream uintptr
	// Event is a CUevent.
	Event uintptr
	// DevPtr is a CUdeviceptr.
	DevPtr uint64
)

// Copy is one asynchronous copy of Height rows of Width bytes between
// device memory and host memory: row k goes from Src+k·SrcPitch to
// Dst+k·DstPitch. ToHost says device → host (a store); otherwise host →
// device (a retrieve). Height 1 is a plain copy (cuMemcpyDtoHAsync /
// cuMemcpyHtoDAsync), more a cuMemcpy2DAsync.
type Copy struct {
	ToHost        bool
	Dev           DevPtr
	DevPitch      int64
	Host          unsafe.Pointer
	HostPitch     int64
	Width, Height int64
}

// Driver is the part of the CUDA driver API the backend uses. Every
// method maps to one or two driver calls; errors carry the CUresult name.
type Driver interface {
	// DeviceByUUID returns the ordinal of the device whose UUID matches
	// (hex digits compared, any "GPU-" prefix and dashes ignored).
	DeviceByUUID(uuid string) (int, error)
	// RetainPrimaryContext is cuDevicePrimaryCtxRetain.
	RetainPrimaryContext(dev int) (Context, error)
	// ReleasePrimaryContext is cuDevicePrimaryCtxRelease.
	ReleasePrimaryContext(dev int) error
	// SetCurrent is cuCtxSetCurrent for the calling OS thread.
	SetCurrent(Context) error
	// StreamCreate is cuStreamCreate(CU_STREAM_NON_BLOCKING).
	StreamCreate() (Stream, error)
	// StreamDestroy is cuStreamDestroy.
	StreamDestroy(Stream) error
	// IpcOpenMemHandle is cuIpcOpenMemHandle(LAZY_ENABLE_PEER_ACCESS).
	IpcOpenMemHandle(IPCHandle) (DevPtr, error)
	// IpcCloseMemHandle is cuIpcCloseMemHandle.
	IpcCloseMemHandle(DevPtr) error
	// IpcOpenEventHandle is cuIpcOpenEventHandle.
	IpcOpenEventHandle(IPCHandle) (Event, error)
	// EventCreateInterprocess is cuEventCreate(INTERPROCESS|DISABLE_TIMING).
	EventCreateInterprocess() (Event, error)
	// IpcGetEventHandle is cuIpcGetEventHandle.
	IpcGetEventHandle(Event) (IPCHandle, error)
	// EventRecord is cuEventRecord.
	EventRecord(Event, Stream) error
	// EventSynchronize is cuEventSynchronize.
	EventSynchronize(Event) error
	// EventDestroy is cuEventDestroy.
	EventDestroy(Event) error
	// StreamSynchronize is cuStreamSynchronize.
	StreamSynchronize(Stream) error
	// StreamWaitEvent is cuStreamWaitEvent.
	StreamWaitEvent(Stream, Event) error
	// MemHostRegister is cuMemHostRegister(PORTABLE) of n bytes at p.
	MemHostRegister(p unsafe.Pointer, n int64) error
	// MemHostUnregister is cuMemHostUnregister.
	MemHostUnregister(p unsafe.Pointer) error
	// CopyAsync enqueues c on the stream.
	CopyAsync(c Copy, s Stream) error
}

// Errors of the backend.
var (
	// ErrNoDriver: libcuda.so.1 is not loadable here (no NVIDIA driver).
	ErrNoDriver = errors.New("CUDA driver not available")
	// ErrNoDevice: no visible device has the wrapper's UUID.
	ErrNoDevice = errors.New("no CUDA device with the registered UUID")
	// ErrNotCUDA: a wrapper is not a CUDA IPC wrapper.
	ErrNotCUDA = errors.New("kv cache wrapper is not CUDA IPC")
	// ErrClosed: the cache was unregistered.
	ErrClosed = errors.New("kv cache closed")
)

// normUUID keeps a UUID string's hex digits, lower-cased.
func normUUID(s string) string {
	s = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "gpu-")
	var b strings.Builder
	for _, c := range s {
		if (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// UUIDString formats 16 UUID bytes the way torch prints a device UUID
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"); DeviceByUUID accepts it
// with or without the prefix.
func UUIDString(u [16]byte) string {
	const hx = "0123456789abcdef"
	var b strings.Builder
	b.WriteString("GPU-")
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b.WriteByte('-')
		}
		b.WriteByte(hx[c>>4])
		b.WriteByte(hx[c&15])
	}
	return b.String()
}
