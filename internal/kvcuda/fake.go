package kvcuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

// Fake is a Driver over host memory for tests and for the GPU check's
// rehearsal (--fake-driver): "device" allocations are Go byte slices
// exported with ExportMem, copies run on the host when the stream
// reaches them, and every call is appended to a log so tests can check
// the order (wait before copies, record after, commit only after the
// event completed, every handle closed). It claims nothing about a GPU.
type Fake struct {
	// UUID is the one device's UUID (default a fixed fake one).
	UUID string
	// Gate, when set, blocks EventSynchronize until it can receive, so a
	// test can observe a transfer in flight.
	Gate chan struct{}
	// FailCopy, when set, is returned by the next CopyAsync (then cleared).
	FailCopy error

	mu       sync.Mutex
	log      []string
	mems     map[IPCHandle][]byte
	opened   map[DevPtr][]byte
	events   map[Event]*fakeEvent
	streams  map[Stream][]func()
	pinned   map[unsafe.Pointer]int64
	ctxRefs  int
	next     uintptr
	exported map[IPCHandle]Event
}

type fakeEvent struct {
	interprocess bool
	ops          []func() // the stream's work up to the record
	done         bool
}

// NewFake returns an empty Fake with one device.
func NewFake() *Fake {
	return &Fake{UUID: "GPU-00000000-0000-0000-0000-00000000fa4e", mems: map[IPCHandle][]byte{}, opened: map[DevPtr][]byte{},
		events: map[Event]*fakeEvent{}, streams: map[Stream][]func(){}, pinned: map[unsafe.Pointer]int64{}, exported: map[IPCHandle]Event{}, next: 1}
}

func (f *Fake) record(format string, args ...any) {
	f.log = append(f.log, fmt.Sprintf(format, args...))
}

// Log returns the calls so far, one "name args" string each.
func (f *Fake) Log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

// Open reports the handles still open: memory handles, events, streams,
// pinned ranges and primary-context references.
func (f *Fake) Open() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.opened)
	return fmt.Sprintf("mem=%d events=%d streams=%d pinned=%d ctx=%d", n, len(f.events), len(f.streams), len(f.pinned), f.ctxRefs)
}

// ExportMem plays the worker's cuIpcGetMemHandle on buf: the returned
// handle opens to buf's address.
func (f *Fake) ExportMem(buf []byte) IPCHandle {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h IPCHandle
	copy(h[:], "fakemem")
	binary.LittleEndian.PutUint64(h[8:], uint64(len(f.mems)+1))
	f.mems[h] = buf
	return h
}

// WorkerEvent plays the worker's interprocess event: its handle, and a
// function that completes it (until then, copies after a wait on it do
// not run).
func (f *Fake) WorkerEvent() (IPCHandle, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := Event(f.alloc())
	f.events[ev] = &fakeEvent{interprocess: true}
	var h IPCHandle
	copy(h[:], "fakeevt")
	binary.LittleEndian.PutUint64(h[8:], uint64(ev))
	f.exported[h] = ev
	delete(f.events, ev) // owned by the worker, not counted as open here
	return h, func() { f.mu.Lock(); f.record("worker-event-complete"); f.mu.Unlock() }
}

func (f *Fake) alloc() uintptr {
	f.next++
	return f.next
}

// DeviceByUUID implements Driver.
func (f *Fake) DeviceByUUID(uuid string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("DeviceByUUID %s", uuid)
	if normUUID(uuid) != normUUID(f.UUID) || normUUID(uuid) == "" {
		return 0, fmt.Errorf("fake driver: no device %q", uuid)
	}
	return 0, nil
}

// RetainPrimaryContext implements Driver.
func (f *Fake) RetainPrimaryContext(dev int) (Context, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("RetainPrimaryContext %d", dev)
	f.ctxRefs++
	return Context(1), nil
}

// ReleasePrimaryContext implements Driver.
func (f *Fake) ReleasePrimaryContext(dev int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("ReleasePrimaryContext %d", dev)
	f.ctxRefs--
	return nil
}

// SetCurrent implements Driver.
func (f *Fake) SetCurrent(Context) error { return nil }

// StreamCreate implements Driver.
func (f *Fake) StreamCreate() (Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := Stream(f.alloc())
	f.streams[s] = nil
	f.record("StreamCreate")
	return s, nil
}

// StreamDestroy implements Driver.
func (f *Fake) StreamDestroy(s Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("StreamDestroy")
	if _, ok := f.streams[s]; !ok {
		return errors.New("fake driver: unknown stream")
	}
	delete(f.streams, s)
	return nil
}

// StreamSynchronize implements Driver.
func (f *Fake) StreamSynchronize(s Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("StreamSynchronize")
	for _, op := range f.streams[s] {
		op()
	}
	f.streams[s] = nil
	return nil
}

// IpcOpenMemHandle implements Driver.
func (f *Fake) IpcOpenMemHandle(h IPCHandle) (DevPtr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("IpcOpenMemHandle")
	buf, ok := f.mems[h]
	if !ok {
		return 0, errors.New("fake driver: CUDA_ERROR_INVALID_VALUE (unknown memory handle)")
	}
	// Fake device addresses: the allocation's number in the high bits,
	// the byte offset in the low 40.
	p := DevPtr(f.alloc()) << fakeOffBits
	f.opened[p] = buf
	return p, nil
}

// IpcCloseMemHandle implements Driver.
func (f *Fake) IpcCloseMemHandle(p DevPtr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("IpcCloseMemHandle")
	if _, ok := f.opened[p]; !ok {
		return errors.New("fake driver: closing a memory handle not open")
	}
	delete(f.opened, p)
	return nil
}

// IpcOpenEventHandle implements Driver.
func (f *Fake) IpcOpenEventHandle(h IPCHandle) (Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("IpcOpenEventHandle")
	if _, ok := f.exported[h]; !ok {
		return 0, errors.New("fake driver: unknown event handle")
	}
	ev := Event(f.alloc())
	f.events[ev] = &fakeEvent{interprocess: true}
	return ev, nil
}

// EventCreateInterprocess implements Driver.
func (f *Fake) EventCreateInterprocess() (Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("EventCreateInterprocess")
	ev := Event(f.alloc())
	f.events[ev] = &fakeEvent{interprocess: true}
	return ev, nil
}

// IpcGetEventHandle implements Driver.
func (f *Fake) IpcGetEventHandle(ev Event) (IPCHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("IpcGetEventHandle")
	var h IPCHandle
	if e, ok := f.events[ev]; !ok || !e.interprocess {
		return h, errors.New("fake driver: not an interprocess event")
	}
	copy(h[:], "fakeevt")
	binary.LittleEndian.PutUint64(h[8:], uint64(ev))
	return h, nil
}

// EventRecord implements Driver: the event completes when the stream's
// work so far has run.
func (f *Fake) EventRecord(ev Event, s Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("EventRecord")
	e, ok := f.events[ev]
	if !ok {
		return errors.New("fake driver: unknown event")
	}
	e.ops, e.done = f.streams[s], false
	f.streams[s] = nil
	return nil
}

// EventSynchronize implements Driver: runs the recorded work (after the
// Gate, when set).
func (f *Fake) EventSynchronize(ev Event) error {
	if f.Gate != nil {
		<-f.Gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.events[ev]
	if !ok {
		return errors.New("fake driver: unknown event")
	}
	if !e.done {
		for _, op := range e.ops {
			op()
		}
		e.ops, e.done = nil, true
	}
	f.record("EventSynchronize")
	return nil
}

// EventDestroy implements Driver.
func (f *Fake) EventDestroy(ev Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("EventDestroy")
	if _, ok := f.events[ev]; !ok {
		return errors.New("fake driver: unknown event")
	}
	delete(f.events, ev)
	return nil
}

// StreamWaitEvent implements Driver.
func (f *Fake) StreamWaitEvent(s Stream, ev Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("StreamWaitEvent")
	if _, ok := f.events[ev]; !ok {
		return errors.New("fake driver: unknown event")
	}
	f.streams[s] = append(f.streams[s], func() { f.record("(stream) waited") })
	return nil
}

// MemHostRegister implements Driver.
func (f *Fake) MemHostRegister(p unsafe.Pointer, n int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("MemHostRegister %d", n)
	if _, ok := f.pinned[p]; ok {
		return errors.New("fake driver: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED")
	}
	f.pinned[p] = n
	return nil
}

// MemHostUnregister implements Driver.
func (f *Fake) MemHostUnregister(p unsafe.Pointer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("MemHostUnregister")
	if _, ok := f.pinned[p]; !ok {
		return errors.New("fake driver: CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED")
	}
	delete(f.pinned, p)
	return nil
}

// CopyAsync implements Driver: the copy runs when the stream reaches it.
func (f *Fake) CopyAsync(c Copy, s Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.FailCopy; err != nil {
		f.FailCopy = nil
		f.record("CopyAsync failed")
		return err
	}
	if c.Width < 0 || c.Height < 1 || (c.Height > 1 && (c.DevPitch < c.Width || c.HostPitch < c.Width)) {
		return fmt.Errorf("fake driver: CUDA_ERROR_INVALID_VALUE (copy %+v)", c)
	}
	dir := "HtoD"
	if c.ToHost {
		dir = "DtoH"
	}
	if c.Height == 1 {
		f.record("Memcpy%sAsync %d", dir, c.Width)
	} else {
		f.record("Memcpy2DAsync %s %dx%d", dir, c.Width, c.Height)
	}
	buf, ok := f.opened[c.Dev&^(1<<fakeOffBits-1)]
	off := int64(c.Dev & (1<<fakeOffBits - 1))
	if !ok || off+(c.Height-1)*c.DevPitch+c.Width > int64(len(buf)) {
		return fmt.Errorf("fake driver: CUDA_ERROR_INVALID_VALUE (device range %#x+%d×%d outside an open allocation)", c.Dev, c.Height, c.DevPitch)
	}
	f.streams[s] = append(f.streams[s], func() {
		for k := range c.Height {
			dev := buf[off+k*c.DevPitch : off+k*c.DevPitch+c.Width]
			host := unsafe.Slice((*byte)(unsafe.Add(c.Host, k*c.HostPitch)), c.Width)
			if c.ToHost {
				copy(host, dev)
			} else {
				copy(dev, host)
			}
		}
		f.record("(stream) copied")
	})
	return nil
}

// Count returns how many logged calls start with prefix.
func (f *Fake) Count(prefix string) int {
	n := 0
	for _, l := range f.Log() {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// fakeOffBits is the width of the offset part of a fake device address.
const fakeOffBits = 40

var _ Driver = (*Fake)(nil)

// WaitHandle plays the worker waiting on the server's completion event
// (cuIpcOpenEventHandle + cuEventSynchronize): it runs the event's work
// if the server has not waited yet, and returns once it is done.
func (f *Fake) WaitHandle(h IPCHandle) error {
	if !bytes.HasPrefix(h[:], []byte("fakeevt")) {
		return errors.New("fake driver: not a fake event handle")
	}
	return f.EventSynchronize(Event(binary.LittleEndian.Uint64(h[8:])))
}

// Locked runs fn under the fake's lock, ordering it with the fake's
// stream work (a worker touching its "device" memory).
func (f *Fake) Locked(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}
