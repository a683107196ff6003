//go:build linux && (amd64 || arm64)

package gpucheck

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/lmcache-go/lmcache/internal/kvcuda"
)

// CUDADevice is a Device on the real driver (device 0's primary context,
// which the calling OS thread must keep current: lock it first).
type CUDADevice struct {
	D    *kvcuda.CUDA
	Dev  int
	uuid string
}

type cudaBuf struct {
	p kvcuda.DevPtr
	h kvcuda.IPCHandle
}

func (b *cudaBuf) Handle() kvcuda.IPCHandle { return b.h }

// OpenCUDA loads the driver and makes device dev's primary context current
// on the calling (locked) OS thread.
func OpenCUDA(dev int) (*CUDADevice, error) {
	d, err := kvcuda.LoadDriver()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoGPU, err)
	}
	n, err := d.DeviceCount()
	if err != nil || n <= dev {
		return nil, fmt.Errorf("%w: %d devices (%v)", ErrNoGPU, n, err)
	}
	ctx, err := d.RetainPrimaryContext(dev)
	if err != nil {
		return nil, err
	}
	if err := d.SetCurrent(ctx); err != nil {
		return nil, err
	}
	u, err := d.DeviceUUID(dev)
	if err != nil {
		return nil, err
	}
	return &CUDADevice{D: d, Dev: dev, uuid: u}, nil
}

// UUID implements Device.
func (c *CUDADevice) UUID() string { return c.uuid }

// Alloc implements Device.
func (c *CUDADevice) Alloc(n int64) (Buffer, error) {
	p, err := c.D.MemAlloc(n)
	if err != nil {
		return nil, err
	}
	h, err := c.D.IpcGetMemHandle(p)
	if err != nil {
		_ = c.D.MemFree(p)
		return nil, err
	}
	return &cudaBuf{p: p, h: h}, nil
}

// Free implements Device.
func (c *CUDADevice) Free(b Buffer) { _ = c.D.MemFree(b.(*cudaBuf).p) }

// Upload implements Device.
func (c *CUDADevice) Upload(b Buffer, src []byte) error { return c.D.CopyHtoD(b.(*cudaBuf).p, src) }

// Download implements Device.
func (c *CUDADevice) Download(dst []byte, b Buffer) error { return c.D.CopyDtoH(dst, b.(*cudaBuf).p) }

// ReadyEvent implements Device (recorded on the legacy default stream,
// after the synchronous uploads).
func (c *CUDADevice) ReadyEvent() (kvcuda.IPCHandle, error) {
	ev, err := c.D.EventCreateInterprocess()
	if err != nil {
		return kvcuda.IPCHandle{}, err
	}
	if err := c.D.EventRecord(ev, 0); err != nil {
		return kvcuda.IPCHandle{}, err
	}
	return c.D.IpcGetEventHandle(ev)
}

// Wait implements Device.
func (c *CUDADevice) Wait(h kvcuda.IPCHandle) error {
	ev, err := c.D.IpcOpenEventHandle(h)
	if err != nil {
		return err
	}
	err = c.D.EventSynchronize(ev)
	if derr := c.D.EventDestroy(ev); err == nil {
		err = derr
	}
	return err
}

// RawCopy implements Device: synchronous copies through one pinned host
// buffer.
func (c *CUDADevice) RawCopy(bufs []Buffer, n int64) (float64, float64, error) {
	host := make([]byte, n)
	if err := c.D.MemHostRegister(unsafe.Pointer(unsafe.SliceData(host)), n); err != nil {
		return 0, 0, err
	}
	defer c.D.MemHostUnregister(unsafe.Pointer(unsafe.SliceData(host)))
	t0 := time.Now()
	for _, b := range bufs {
		if err := c.Download(host, b); err != nil {
			return 0, 0, err
		}
	}
	t1 := time.Now()
	for _, b := range bufs {
		if err := c.Upload(b, host); err != nil {
			return 0, 0, err
		}
	}
	t2 := time.Now()
	total := float64(n) * float64(len(bufs))
	return total / t1.Sub(t0).Seconds() / 1e9, total / t2.Sub(t1).Seconds() / 1e9, nil
}
