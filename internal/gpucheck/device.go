package gpucheck

import (
	"time"

	"github.com/lmcache-go/lmcache/internal/kvcuda"
)

// Buffer is one device allocation exported over CUDA IPC.
type Buffer interface {
	Handle() kvcuda.IPCHandle
}

// Device is the worker's side of the GPU: allocation, uploads, its IPC
// event, waiting on the server's event, and the raw copy baseline.
type Device interface {
	UUID() string
	Alloc(n int64) (Buffer, error)
	Free(Buffer)
	Upload(b Buffer, src []byte) error
	Download(dst []byte, b Buffer) error
	// ReadyEvent records an interprocess event after the work so far and
	// returns its handle (the worker's event_ipc_handle).
	ReadyEvent() (kvcuda.IPCHandle, error)
	// Wait waits on the server's completion event.
	Wait(kvcuda.IPCHandle) error
	// RawCopy times a device-to-host and a host-to-device copy of every
	// buffer (n bytes each) through pinned host memory and returns GB/s.
	RawCopy(bufs []Buffer, n int64) (d2h, h2d float64, err error)
}

// FakeDevice is a Device on kvcuda.Fake: host memory, no GPU.
type FakeDevice struct{ F *kvcuda.Fake }

type fakeBuf struct {
	mem []byte
	h   kvcuda.IPCHandle
}

func (b *fakeBuf) Handle() kvcuda.IPCHandle { return b.h }

// UUID implements Device.
func (d FakeDevice) UUID() string { return d.F.UUID }

// Alloc implements Device.
func (d FakeDevice) Alloc(n int64) (Buffer, error) {
	m := make([]byte, n)
	return &fakeBuf{mem: m, h: d.F.ExportMem(m)}, nil
}

// Free implements Device.
func (d FakeDevice) Free(Buffer) {}

// Upload implements Device. The fake's copies run under its lock, as do
// these, so the server's copies never overlap them.
func (d FakeDevice) Upload(b Buffer, src []byte) error {
	d.F.Locked(func() { copy(b.(*fakeBuf).mem, src) })
	return nil
}

// Download implements Device.
func (d FakeDevice) Download(dst []byte, b Buffer) error {
	d.F.Locked(func() { copy(dst, b.(*fakeBuf).mem) })
	return nil
}

// ReadyEvent implements Device.
func (d FakeDevice) ReadyEvent() (kvcuda.IPCHandle, error) {
	h, _ := d.F.WorkerEvent()
	return h, nil
}

// Wait implements Device.
func (d FakeDevice) Wait(h kvcuda.IPCHandle) error { return d.F.WaitHandle(h) }

// RawCopy implements Device with copy() (a host figure, not a GPU one).
func (d FakeDevice) RawCopy(bufs []Buffer, n int64) (float64, float64, error) {
	host := make([]byte, n)
	t0 := time.Now()
	for _, b := range bufs {
		_ = d.Download(host, b)
	}
	t1 := time.Now()
	for _, b := range bufs {
		_ = d.Upload(b, host)
	}
	t2 := time.Now()
	total := float64(n) * float64(len(bufs))
	return total / t1.Sub(t0).Seconds() / 1e9, total / t2.Sub(t1).Seconds() / 1e9, nil
}
