package kvcuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
	"github.com/lmcache-go/lmcache/internal/kvwrap"
)

// MaxSegments bounds the distinct memory handles of one registration.
const MaxSegments = 1024

// keptEvents is how many completion events a cache keeps alive after
// their transfer finished: the worker opens an event's IPC handle after
// the reply, so it must outlive the reply for a while. The oldest is
// destroyed when a newer one is created; all go on Close.
const keptEvents = 256

// Registration is what a REGISTER_KV_CACHE carried besides the tensors.
type Registration struct {
	Engine string
	Hints  kvlayout.Hints
	Groups int
}

// Cache is one registered CUDA paged KV cache: its opened IPC memory, the
// device's primary context, a stream and the events in use.
type Cache struct {
	// Layout is the detected paged layout.
	Layout *kvlayout.Layout

	drv    Driver
	dev    int
	ctx    Context
	stream Stream
	ptrs   []DevPtr // one per distinct memory handle
	sizes  []int64  // bytes usable from each pointer

	mu      sync.Mutex // serialises enqueueing; guards the fields below
	closed  bool
	waits   map[IPCHandle]Event // the worker's events, opened once each
	done    []*liveEvent        // completion events still alive, oldest first
	pending sync.WaitGroup      // completion goroutines
}

// liveEvent is a completion event and whether its wait finished (only
// then may it be destroyed).
type liveEvent struct {
	ev       Event
	finished bool // guarded by Cache.mu
}

// Open opens the memory handles of ws on the device whose UUID they name
// and detects the layout. On error everything opened is closed again.
func Open(drv Driver, ws []kvwrap.Wrapper, reg Registration) (_ *Cache, err error) {
	if drv == nil {
		return nil, ErrNoDriver
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("%w: no kv tensors registered", kvlayout.ErrUnsupported)
	}
	uuid := ws[0].DeviceUUID
	index := map[IPCHandle]int{}
	var handles []IPCHandle
	var sizes []int64
	segOf := make([]int, len(ws))
	bases := make([]int64, len(ws))
	for i, w := range ws {
		if (w.Kind != kvwrap.KindCUDAIPC && w.Kind != kvwrap.KindRawCUDAIPC) || w.CUDA == nil {
			return nil, fmt.Errorf("%w: layer %d is %v", ErrNotCUDA, i, w.Kind)
		}
		if normUUID(w.DeviceUUID) != normUUID(uuid) {
			return nil, fmt.Errorf("%w: layer %d is on device %q, layer 0 on %q", kvlayout.ErrUnsupported, i, w.DeviceUUID, uuid)
		}
		if len(w.CUDA.MemHandle) != len(IPCHandle{}) {
			return nil, fmt.Errorf("%w: layer %d memory handle is %d bytes", kvwrap.ErrMalformed, i, len(w.CUDA.MemHandle))
		}
		var h IPCHandle
		copy(h[:], w.CUDA.MemHandle)
		// The storage spans [StorageOffsetBytes, +StorageBytes) of the
		// allocation the handle opens (raw wrappers: [0, NBytes)).
		size := w.CUDA.StorageOffsetBytes + w.CUDA.StorageBytes
		if w.Kind == kvwrap.KindRawCUDAIPC {
			size = w.NBytes
		}
		ext, err := w.Extent()
		if err != nil {
			return nil, err
		}
		bases[i] = w.CUDA.StorageOffsetBytes
		// ext > size-base, not base+ext > size: the sum of an offset near
		// 2^63 and the extent wraps negative and passed.
		if w.CUDA.StorageOffsetBytes < 0 || w.CUDA.StorageBytes < 0 || size <= 0 || ext > size-bases[i] {
			return nil, fmt.Errorf("%w: layer %d view needs %d bytes from offset %d, the storage has %d", kvwrap.ErrMalformed, i, ext, bases[i], size)
		}
		j, ok := index[h]
		if !ok {
			if len(handles) == MaxSegments {
				return nil, fmt.Errorf("%w: more than %d memory handles", kvlayout.ErrUnsupported, MaxSegments)
			}
			j = len(handles)
			index[h] = j
			handles = append(handles, h)
			sizes = append(sizes, 0)
		}
		sizes[j] = max(sizes[j], size)
		segOf[i] = j
	}
	ts := make([]kvlayout.Tensor, len(ws))
	for i, w := range ws {
		ts[i] = kvlayout.Tensor{Dtype: w.Dtype, ItemSize: w.ItemSize, Shape: w.Shape, Stride: w.Stride,
			Segment: segOf[i], BaseByte: bases[i] + w.StorageOffset*w.ItemSize}
	}
	layout, err := kvlayout.Detect(kvlayout.Input{Tensors: ts, Engine: reg.Engine, Hints: reg.Hints, Groups: reg.Groups})
	if err != nil {
		return nil, err
	}
	dev, err := drv.DeviceByUUID(uuid)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrNoDevice, uuid, err)
	}
	c := &Cache{Layout: layout, drv: drv, dev: dev, sizes: sizes, waits: map[IPCHandle]Event{}}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c.ctx, err = drv.RetainPrimaryContext(dev); err != nil {
		return nil, fmt.Errorf("retain the primary context of device %d: %w", dev, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.release())
		}
	}()
	if err = drv.SetCurrent(c.ctx); err != nil {
		return nil, err
	}
	if c.stream, err = drv.StreamCreate(); err != nil {
		return nil, err
	}
	for _, h := range handles {
		p, err := drv.IpcOpenMemHandle(h)
		if err != nil {
			return nil, fmt.Errorf("open the worker's memory handle: %w", err)
		}
		c.ptrs = append(c.ptrs, p)
	}
	return c, nil
}

// Device is the ordinal the cache's memory lives on.
func (c *Cache) Device() int { return c.dev }

// Direction of a transfer.
const (
	Store    = true  // device blocks → host objects (Gather)
	Retrieve = false // host objects → device blocks (Scatter)
)

// Submit enqueues the plan's copies between the cache and objs (pinned
// host memory, see Pin) on the cache's stream: first a wait on the
// worker's event (waitEvent, when not empty), then one copy per run,
// then a record of a fresh interprocess event whose handle is returned
// for the reply. done runs once, on a goroutine the cache owns, after the
// copies completed (err nil) or failed; the caller commits or aborts
// there. When Submit returns an error nothing was enqueued that will
// touch objs and done is not called.
func (c *Cache) Submit(p *kvlayout.Plan, objs [][]byte, store bool, waitEvent []byte, done func(error)) (IPCHandle, error) {
	var none IPCHandle
	ol := make([]int64, len(objs))
	for i, o := range objs {
		ol[i] = int64(len(o))
	}
	if err := p.CheckSizes(c.sizes, ol); err != nil {
		return none, err
	}
	if len(waitEvent) != 0 && len(waitEvent) != len(IPCHandle{}) {
		return none, fmt.Errorf("%w: event_ipc_handle is %d bytes, want 0 or 64", kvlayout.ErrBadRequest, len(waitEvent))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return none, ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.drv.SetCurrent(c.ctx); err != nil {
		return none, err
	}
	if len(waitEvent) != 0 {
		var h IPCHandle
		copy(h[:], waitEvent)
		ev, ok := c.waits[h]
		if !ok {
			var err error
			if ev, err = c.drv.IpcOpenEventHandle(h); err != nil {
				return none, fmt.Errorf("open the worker's event: %w", err)
			}
			c.waits[h] = ev
		}
		if err := c.drv.StreamWaitEvent(c.stream, ev); err != nil {
			return none, err
		}
	}
	ev, err := c.drv.EventCreateInterprocess()
	if err != nil {
		return none, err
	}
	var qerr error
	for _, r := range p.Runs {
		cp := Copy{ToHost: store, Dev: c.ptrs[r.Seg] + DevPtr(r.SegOff), DevPitch: r.SegStep,
			Host: unsafe.Add(unsafe.Pointer(unsafe.SliceData(objs[r.Obj])), r.ObjOff), HostPitch: r.ObjStep,
			Width: r.Len, Height: r.Count}
		if r.Count == 1 {
			cp.DevPitch, cp.HostPitch = r.Len, r.Len
		}
		if qerr = c.drv.CopyAsync(cp, c.stream); qerr != nil {
			break
		}
	}
	// The event is recorded even after a failed enqueue: waiting on it
	// is how copies already enqueued are known to be over before objs
	// are handed back.
	if err := c.drv.EventRecord(ev, c.stream); err != nil {
		// Without the event, only a full stream wait says the copies
		// already enqueued are over before objs go back to the caller.
		serr := c.drv.StreamSynchronize(c.stream)
		c.keep(ev, true)
		return none, errors.Join(qerr, fmt.Errorf("record the completion event: %w", err), serr)
	}
	if qerr != nil {
		serr := c.drv.EventSynchronize(ev)
		c.keep(ev, true)
		return none, errors.Join(fmt.Errorf("enqueue copy: %w", qerr), serr)
	}
	h, err := c.drv.IpcGetEventHandle(ev)
	if err != nil {
		serr := c.drv.EventSynchronize(ev)
		c.keep(ev, true)
		return none, errors.Join(err, serr)
	}
	le := c.keep(ev, false)
	c.pending.Add(1)
	go func() {
		defer c.pending.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// The wait runs even if SetCurrent failed: done must not run
		// while a copy may still touch objs.
		err := errors.Join(c.drv.SetCurrent(c.ctx), c.drv.EventSynchronize(ev))
		c.mu.Lock()
		le.finished = true
		c.mu.Unlock()
		done(err)
	}()
	return h, nil
}

// keep adds ev to the live completion events and destroys the oldest
// finished ones beyond keptEvents (one still waited on is kept, however
// many are newer). c.mu is held.
func (c *Cache) keep(ev Event, finished bool) *liveEvent {
	le := &liveEvent{ev: ev, finished: finished}
	c.done = append(c.done, le)
	for len(c.done) > keptEvents && c.done[0].finished {
		// A destroy error leaks only the event.
		_ = c.drv.EventDestroy(c.done[0].ev)
		c.done = c.done[1:]
	}
	return le
}

// Close waits for every transfer in flight, then destroys the events and
// stream, closes the memory handles and releases the context. It is
// idempotent.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed && c.ptrs == nil {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.pending.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return c.release()
}

// release frees everything Open and Submit acquired.
func (c *Cache) release() error {
	var errs []error
	if c.ctx != 0 {
		if err := c.drv.SetCurrent(c.ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, le := range c.done {
		errs = append(errs, c.drv.EventDestroy(le.ev))
	}
	c.done = nil
	for h, ev := range c.waits {
		errs = append(errs, c.drv.EventDestroy(ev))
		delete(c.waits, h)
	}
	for _, p := range c.ptrs {
		errs = append(errs, c.drv.IpcCloseMemHandle(p))
	}
	c.ptrs = nil
	if c.stream != 0 {
		errs = append(errs, c.drv.StreamDestroy(c.stream))
		c.stream = 0
	}
	if c.ctx != 0 {
		errs = append(errs, c.drv.ReleasePrimaryContext(c.dev))
		c.ctx = 0
	}
	return errors.Join(errs...)
}

// Pin registers host memory (the L1 pool) with the driver so copies to
// and from it run asynchronously at full speed; Unpin undoes it.
func Pin(drv Driver, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return drv.MemHostRegister(unsafe.Pointer(unsafe.SliceData(mem)), int64(len(mem)))
}

// Unpin unregisters memory registered by Pin.
func Unpin(drv Driver, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return drv.MemHostUnregister(unsafe.Pointer(unsafe.SliceData(mem)))
}
