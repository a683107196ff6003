//go:build linux && (amd64 || arm64)

package kvcuda

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// LibName is the CUDA driver library loaded at run time.
const LibName = "libcuda.so.1"

// Driver API constants (cuda.h).
const (
	cuStreamNonBlocking         = 0x1
	cuEventDisableTiming        = 0x2
	cuEventInterprocess         = 0x4
	cuIpcMemLazyEnablePeerAcces = 0x1
	cuMemHostRegisterPortable   = 0x1
	cuMemorytypeHost            = 1
	cuMemorytypeDevice          = 2
)

// memcpy2D is CUDA_MEMCPY2D (64-bit layout).
type memcpy2D struct {
	_             [2]uint64 // srcXInBytes, srcY: 0
	srcMemoryType uint32
	_             uint32
	srcHost       unsafe.Pointer
	srcDevice     uint64
	_             uintptr // srcArray
	srcPitch      uint64
	_             [2]uint64 // dstXInBytes, dstY: 0
	dstMemoryType uint32
	_             uint32
	dstHost       unsafe.Pointer
	dstDevice     uint64
	_             uintptr // dstArray
	dstPitch      uint64
	widthInBytes  uint64
	height        uint64
}

// cHandle is CUipcMemHandle / CUipcEventHandle as C passes them by
// value: a struct of 64 bytes (purego passes structs, not bare arrays).
type cHandle struct{ Reserved [64]byte }

// cuda is the Driver bound to libcuda.so.1.
type cuda struct {
	cuInit                    func(flags uint32) int32
	cuGetErrorName            func(res int32, name **byte) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDeviceGetUuid           func(uuid *[16]byte, dev int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuStreamCreate            func(s *uintptr, flags uint32) int32
	cuStreamDestroy           func(s uintptr) int32
	cuStreamSynchronize       func(s uintptr) int32
	cuStreamWaitEvent         func(s, ev uintptr, flags uint32) int32
	cuIpcOpenMemHandle        func(p *uint64, h cHandle, flags uint32) int32
	cuIpcCloseMemHandle       func(p uint64) int32
	cuIpcOpenEventHandle      func(ev *uintptr, h cHandle) int32
	cuIpcGetEventHandle       func(h *IPCHandle, ev uintptr) int32
	cuEventCreate             func(ev *uintptr, flags uint32) int32
	cuEventRecord             func(ev, s uintptr) int32
	cuEventSynchronize        func(ev uintptr) int32
	cuEventDestroy            func(ev uintptr) int32
	cuMemHostRegister         func(p unsafe.Pointer, n uint64, flags uint32) int32
	cuMemHostUnregister       func(p unsafe.Pointer) int32
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) int32
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) int32
	cuMemcpy2DAsync           func(c *memcpy2D, s uintptr) int32
	cuMemAlloc                func(p *uint64, n uint64) int32
	cuMemFree                 func(p uint64) int32
	cuIpcGetMemHandle         func(h *IPCHandle, p uint64) int32
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, n uint64) int32
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, n uint64) int32
	cuCtxSynchronize          func() int32
}

var (
	loadOnce sync.Once
	loaded   *CUDA
	loadErr  error
)

// CUDA is the driver API bound to libcuda.so.1. Besides Driver it has the
// calls the GPU check's stand-in worker needs (allocation and export).
type CUDA struct{ c *cuda }

// LoadDriver loads libcuda.so.1 and calls cuInit once per process. Where
// the library is missing it returns an error wrapping ErrNoDriver.
func LoadDriver() (*CUDA, error) {
	loadOnce.Do(func() { loaded, loadErr = load() })
	return loaded, loadErr
}

func load() (*CUDA, error) {
	lib, err := purego.Dlopen(LibName, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoDriver, LibName, err)
	}
	c := &cuda{}
	if err := c.bind(func(name string) (uintptr, error) { return purego.Dlsym(lib, name) }); err != nil {
		return nil, err
	}
	d := &CUDA{c}
	if err := d.check("cuInit", c.cuInit(0)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoDriver, err)
	}
	return d, nil
}

// bind resolves every driver function with sym and registers it with
// purego (which checks each Go signature against the C calling
// convention when it registers, so an unsupported one fails here, not
// in a call).
func (c *cuda) bind(sym func(string) (uintptr, error)) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: binding %s: %v", ErrNoDriver, LibName, r)
		}
	}()
	for name, fn := range map[string]any{
		"cuInit": &c.cuInit, "cuGetErrorName": &c.cuGetErrorName, "cuDeviceGetCount": &c.cuDeviceGetCount,
		"cuDeviceGet": &c.cuDeviceGet, "cuDeviceGetUuid_v2": &c.cuDeviceGetUuid,
		"cuDevicePrimaryCtxRetain": &c.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRelease_v2": &c.cuDevicePrimaryCtxRelease,
		"cuCtxSetCurrent": &c.cuCtxSetCurrent, "cuStreamCreate": &c.cuStreamCreate, "cuStreamDestroy_v2": &c.cuStreamDestroy,
		"cuStreamSynchronize": &c.cuStreamSynchronize, "cuStreamWaitEvent": &c.cuStreamWaitEvent,
		"cuIpcOpenMemHandle_v2": &c.cuIpcOpenMemHandle, "cuIpcCloseMemHandle": &c.cuIpcCloseMemHandle,
		"cuIpcOpenEventHandle": &c.cuIpcOpenEventHandle, "cuIpcGetEventHandle": &c.cuIpcGetEventHandle,
		"cuEventCreate": &c.cuEventCreate, "cuEventRecord": &c.cuEventRecord, "cuEventSynchronize": &c.cuEventSynchronize,
		"cuEventDestroy_v2": &c.cuEventDestroy, "cuMemHostRegister_v2": &c.cuMemHostRegister,
		"cuMemHostUnregister": &c.cuMemHostUnregister, "cuMemcpyDtoHAsync_v2": &c.cuMemcpyDtoHAsync,
		"cuMemcpyHtoDAsync_v2": &c.cuMemcpyHtoDAsync, "cuMemcpy2DAsync_v2": &c.cuMemcpy2DAsync,
		"cuMemAlloc_v2": &c.cuMemAlloc, "cuMemFree_v2": &c.cuMemFree, "cuIpcGetMemHandle": &c.cuIpcGetMemHandle,
		"cuMemcpyDtoH_v2": &c.cuMemcpyDtoH, "cuMemcpyHtoD_v2": &c.cuMemcpyHtoD, "cuCtxSynchronize": &c.cuCtxSynchronize,
	} {
		addr, err := sym(name)
		if err != nil {
			return fmt.Errorf("%w: %s lacks %s: %w", ErrNoDriver, LibName, name, err)
		}
		purego.RegisterFunc(fn, addr)
	}
	return nil
}

// check turns a CUresult into an error naming it.
func (d *CUDA) check(call string, res int32) error {
	if res == 0 {
		return nil
	}
	var p *byte
	name := fmt.Sprintf("CUresult %d", res)
	if d.c.cuGetErrorName(res, &p) == 0 && p != nil {
		name = bytePtrString(p)
	}
	return fmt.Errorf("%s: %s", call, name)
}

func bytePtrString(p *byte) string {
	var b []byte
	for i := 0; i < 128; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// DeviceCount is cuDeviceGetCount.
func (d *CUDA) DeviceCount() (int, error) {
	var n int32
	err := d.check("cuDeviceGetCount", d.c.cuDeviceGetCount(&n))
	return int(n), err
}

// DeviceUUID is cuDeviceGetUuid of ordinal i, formatted by UUIDString.
func (d *CUDA) DeviceUUID(i int) (string, error) {
	var dev int32
	if err := d.check("cuDeviceGet", d.c.cuDeviceGet(&dev, int32(i))); err != nil {
		return "", err
	}
	var u [16]byte
	if err := d.check("cuDeviceGetUuid", d.c.cuDeviceGetUuid(&u, dev)); err != nil {
		return "", err
	}
	return UUIDString(u), nil
}

// DeviceByUUID implements Driver.
func (d *CUDA) DeviceByUUID(uuid string) (int, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return 0, err
	}
	for i := range n {
		u, err := d.DeviceUUID(i)
		if err != nil {
			return 0, err
		}
		if normUUID(u) == normUUID(uuid) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("none of %d visible devices has UUID %q", n, uuid)
}

// RetainPrimaryContext implements Driver.
func (d *CUDA) RetainPrimaryContext(dev int) (Context, error) {
	var ctx uintptr
	err := d.check("cuDevicePrimaryCtxRetain", d.c.cuDevicePrimaryCtxRetain(&ctx, int32(dev)))
	return Context(ctx), err
}

// ReleasePrimaryContext implements Driver.
func (d *CUDA) ReleasePrimaryContext(dev int) error {
	return d.check("cuDevicePrimaryCtxRelease", d.c.cuDevicePrimaryCtxRelease(int32(dev)))
}

// SetCurrent implements Driver.
func (d *CUDA) SetCurrent(ctx Context) error {
	return d.check("cuCtxSetCurrent", d.c.cuCtxSetCurrent(uintptr(ctx)))
}

// StreamCreate implements Driver.
func (d *CUDA) StreamCreate() (Stream, error) {
	var s uintptr
	err := d.check("cuStreamCreate", d.c.cuStreamCreate(&s, cuStreamNonBlocking))
	return Stream(s), err
}

// StreamDestroy implements Driver.
func (d *CUDA) StreamDestroy(s Stream) error {
	return d.check("cuStreamDestroy", d.c.cuStreamDestroy(uintptr(s)))
}

// StreamSynchronize implements Driver.
func (d *CUDA) StreamSynchronize(s Stream) error {
	return d.check("cuStreamSynchronize", d.c.cuStreamSynchronize(uintptr(s)))
}

// StreamWaitEvent implements Driver.
func (d *CUDA) StreamWaitEvent(s Stream, ev Event) error {
	return d.check("cuStreamWaitEvent", d.c.cuStreamWaitEvent(uintptr(s), uintptr(ev), 0))
}

// IpcOpenMemHandle implements Driver.
func (d *CUDA) IpcOpenMemHandle(h IPCHandle) (DevPtr, error) {
	var p uint64
	err := d.check("cuIpcOpenMemHandle", d.c.cuIpcOpenMemHandle(&p, cHandle{h}, cuIpcMemLazyEnablePeerAcces))
	return DevPtr(p), err
}

// IpcCloseMemHandle implements Driver.
func (d *CUDA) IpcCloseMemHandle(p DevPtr) error {
	return d.check("cuIpcCloseMemHandle", d.c.cuIpcCloseMemHandle(uint64(p)))
}

// IpcOpenEventHandle implements Driver.
func (d *CUDA) IpcOpenEventHandle(h IPCHandle) (Event, error) {
	var ev uintptr
	err := d.check("cuIpcOpenEventHandle", d.c.cuIpcOpenEventHandle(&ev, cHandle{h}))
	return Event(ev), err
}

// EventCreateInterprocess implements Driver.
func (d *CUDA) EventCreateInterprocess() (Event, error) {
	var ev uintptr
	err := d.check("cuEventCreate", d.c.cuEventCreate(&ev, cuEventInterprocess|cuEventDisableTiming))
	return Event(ev), err
}

// IpcGetEventHandle implements Driver.
func (d *CUDA) IpcGetEventHandle(ev Event) (IPCHandle, error) {
	var h IPCHandle
	err := d.check("cuIpcGetEventHandle", d.c.cuIpcGetEventHandle(&h, uintptr(ev)))
	return h, err
}

// EventRecord implements Driver.
func (d *CUDA) EventRecord(ev Event, s Stream) error {
	return d.check("cuEventRecord", d.c.cuEventRecord(uintptr(ev), uintptr(s)))
}

// EventSynchronize implements Driver.
func (d *CUDA) EventSynchronize(ev Event) error {
	return d.check("cuEventSynchronize", d.c.cuEventSynchronize(uintptr(ev)))
}

// EventDestroy implements Driver.
func (d *CUDA) EventDestroy(ev Event) error {
	return d.check("cuEventDestroy", d.c.cuEventDestroy(uintptr(ev)))
}

// MemHostRegister implements Driver.
func (d *CUDA) MemHostRegister(p unsafe.Pointer, n int64) error {
	return d.check("cuMemHostRegister", d.c.cuMemHostRegister(p, uint64(n), cuMemHostRegisterPortable))
}

// MemHostUnregister implements Driver.
func (d *CUDA) MemHostUnregister(p unsafe.Pointer) error {
	return d.check("cuMemHostUnregister", d.c.cuMemHostUnregister(p))
}

// CopyAsync implements Driver.
func (d *CUDA) CopyAsync(c Copy, s Stream) error {
	if c.Height == 1 {
		if c.ToHost {
			return d.check("cuMemcpyDtoHAsync", d.c.cuMemcpyDtoHAsync(c.Host, uint64(c.Dev), uint64(c.Width), uintptr(s)))
		}
		return d.check("cuMemcpyHtoDAsync", d.c.cuMemcpyHtoDAsync(uint64(c.Dev), c.Host, uint64(c.Width), uintptr(s)))
	}
	m := memcpy2D{widthInBytes: uint64(c.Width), height: uint64(c.Height)}
	if c.ToHost {
		m.srcMemoryType, m.srcDevice, m.srcPitch = cuMemorytypeDevice, uint64(c.Dev), uint64(c.DevPitch)
		m.dstMemoryType, m.dstHost, m.dstPitch = cuMemorytypeHost, c.Host, uint64(c.HostPitch)
	} else {
		m.srcMemoryType, m.srcHost, m.srcPitch = cuMemorytypeHost, c.Host, uint64(c.HostPitch)
		m.dstMemoryType, m.dstDevice, m.dstPitch = cuMemorytypeDevice, uint64(c.Dev), uint64(c.DevPitch)
	}
	return d.check("cuMemcpy2DAsync", d.c.cuMemcpy2DAsync(&m, uintptr(s)))
}

// MemAlloc is cuMemAlloc (the stand-in worker's KV cache).
func (d *CUDA) MemAlloc(n int64) (DevPtr, error) {
	var p uint64
	err := d.check("cuMemAlloc", d.c.cuMemAlloc(&p, uint64(n)))
	return DevPtr(p), err
}

// MemFree is cuMemFree.
func (d *CUDA) MemFree(p DevPtr) error { return d.check("cuMemFree", d.c.cuMemFree(uint64(p))) }

// IpcGetMemHandle is cuIpcGetMemHandle.
func (d *CUDA) IpcGetMemHandle(p DevPtr) (IPCHandle, error) {
	var h IPCHandle
	err := d.check("cuIpcGetMemHandle", d.c.cuIpcGetMemHandle(&h, uint64(p)))
	return h, err
}

// CopyDtoH is a synchronous cuMemcpyDtoH.
func (d *CUDA) CopyDtoH(dst []byte, src DevPtr) error {
	return d.check("cuMemcpyDtoH", d.c.cuMemcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), uint64(src), uint64(len(dst))))
}

// CopyHtoD is a synchronous cuMemcpyHtoD.
func (d *CUDA) CopyHtoD(dst DevPtr, src []byte) error {
	return d.check("cuMemcpyHtoD", d.c.cuMemcpyHtoD(uint64(dst), unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src))))
}

// CtxSynchronize is cuCtxSynchronize.
func (d *CUDA) CtxSynchronize() error { return d.check("cuCtxSynchronize", d.c.cuCtxSynchronize()) }

var _ Driver = (*CUDA)(nil)
