// Package kvcopy is the CPU backend of the lmcache-driven data path: it
// maps the POSIX shared-memory segments that an LMCache client registered
// with CpuShmTensorWrapper tensors (LMCACHE_MP_TRANSFER_MODE=lmcache_driven
// on a CPU host) and runs kvlayout copy plans between those paged blocks
// and L1 object bytes with plain CPU copies.
//
// The client owns the segments: they are mapped read-write and shared,
// never created, resized or unlinked here. A client that shrinks a
// segment under a mapping would make the next copy fault (SIGBUS); copies
// run with runtime/debug.SetPanicOnFault so such a fault becomes an error
// for that request instead of killing the server.
package kvcopy

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
	"github.com/lmcache-go/lmcache/internal/kvwrap"
)

// DefaultDir is where POSIX shared-memory segments live on Linux.
const DefaultDir = "/dev/shm"

// MaxSegments bounds the distinct segments one registration may map
// (one per layer at most; large models have about a hundred layers).
const MaxSegments = 1024

var (
	// ErrNotCPU: a wrapper is not a CPU shared-memory wrapper (CUDA IPC
	// needs a GPU backend this package does not have).
	ErrNotCPU = errors.New("kv cache wrapper is not CPU shared memory")
	// ErrSegment: a segment cannot be opened or is smaller than declared.
	ErrSegment = errors.New("kv cache segment unusable")
	// ErrClosed: the cache was unregistered.
	ErrClosed = errors.New("kv cache closed")
	// ErrFault: a copy touched memory that is no longer mapped (the client
	// truncated or replaced its segment).
	ErrFault = errors.New("kv cache segment fault during copy")
)

// openMaps counts the segment mappings this process holds (all caches).
var openMaps atomic.Int64

// OpenMappings is the number of shared-memory segment mappings currently
// held by all caches; tests use it to prove unregister, reaping and
// shutdown unmap everything.
func OpenMappings() int64 { return openMaps.Load() }

// Registration is what a REGISTER_KV_CACHE carried besides the tensors.
type Registration struct {
	Engine string
	Hints  kvlayout.Hints
	Groups int
}

// Cache is one registered paged KV cache: its mappings and layout. Copies
// hold a read lock so Close never unmaps memory a copy is using.
type Cache struct {
	// Layout is the detected paged layout.
	Layout *kvlayout.Layout
	// Segments are the mapped segment names (without the leading "/").
	Segments []string

	mu     sync.RWMutex
	maps   [][]byte
	closed bool
}

// Open maps the segments named by wrappers (from dir, DefaultDir when
// empty) and detects the layout. Everything is checked before anything
// stays mapped: on error no mapping is left behind.
func Open(dir string, ws []kvwrap.Wrapper, reg Registration) (_ *Cache, err error) {
	if dir == "" {
		dir = DefaultDir
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("%w: no kv tensors registered", kvlayout.ErrUnsupported)
	}
	index := map[string]int{}
	var names []string
	var need []int64
	segOf := make([]int, len(ws))
	for i, w := range ws {
		if w.Kind != kvwrap.KindCPUShm {
			return nil, fmt.Errorf("%w: layer %d is %v", ErrNotCPU, i, w.Kind)
		}
		name, err := kvwrap.ShmName(w.ShmName)
		if err != nil {
			return nil, err
		}
		ext, err := w.Extent()
		if err != nil {
			return nil, err
		}
		if ext > w.NBytes {
			return nil, fmt.Errorf("%w: layer %d view needs %d bytes of %q, wrapper says %d", ErrSegment, i, ext, name, w.NBytes)
		}
		j, ok := index[name]
		if !ok {
			if len(names) == MaxSegments {
				return nil, fmt.Errorf("%w: more than %d segments", ErrSegment, MaxSegments)
			}
			j = len(names)
			index[name] = j
			names = append(names, name)
			need = append(need, 0)
		}
		need[j] = max(need[j], w.NBytes)
		segOf[i] = j
	}
	c := &Cache{Segments: names}
	defer func() {
		if err != nil {
			_ = c.unmap()
		}
	}()
	for j, name := range names {
		m, err := mapSegment(filepath.Join(dir, name), need[j])
		if err != nil {
			return nil, err
		}
		c.maps = append(c.maps, m)
		openMaps.Add(1)
	}
	ts := make([]kvlayout.Tensor, len(ws))
	for i, w := range ws {
		ts[i] = kvlayout.Tensor{Dtype: w.Dtype, ItemSize: w.ItemSize, Shape: w.Shape, Stride: w.Stride,
			Segment: segOf[i], BaseByte: w.StorageOffset * w.ItemSize}
	}
	c.Layout, err = kvlayout.Detect(kvlayout.Input{Tensors: ts, Engine: reg.Engine, CPU: true, Hints: reg.Hints, Groups: reg.Groups})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// mapSegment maps n bytes of an existing regular file read-write, shared.
func mapSegment(path string, n int64) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: %s: empty segment", ErrSegment, path)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %w", ErrSegment, path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: stat %s: %w", ErrSegment, path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrSegment, path)
	}
	if st.Size < n {
		return nil, fmt.Errorf("%w: %s is %d bytes, the wrapper declares %d", ErrSegment, path, st.Size, n)
	}
	if n != int64(int(n)) {
		return nil, fmt.Errorf("%w: %s: %d bytes", ErrSegment, path, n)
	}
	m, err := unix.Mmap(fd, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: mmap %s: %w", ErrSegment, path, err)
	}
	return m, nil
}

// Gather copies the plan's blocks into objs (a store).
func (c *Cache) Gather(p *kvlayout.Plan, objs [][]byte) error {
	return c.run(p, objs, true)
}

// Scatter copies objs into the plan's blocks (a retrieve).
func (c *Cache) Scatter(p *kvlayout.Plan, objs [][]byte) error {
	return c.run(p, objs, false)
}

func (c *Cache) run(p *kvlayout.Plan, objs [][]byte, gather bool) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return ErrClosed
	}
	if err := p.Check(c.maps, objs); err != nil {
		return err
	}
	parts := split(p, copyWorkers(p.Bytes))
	if len(parts) == 1 {
		return c.runRange(p, objs, gather, 0, len(p.Runs))
	}
	// The request owns its copy goroutines: all of them finish before it
	// returns, so Close (which waits for the read lock) never unmaps
	// memory one of them is using.
	errs := make([]error, len(parts)-1)
	var wg sync.WaitGroup
	for i := 1; i < len(parts); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i-1] = c.runRange(p, objs, gather, parts[i-1], parts[i])
		}()
	}
	err := c.runRange(p, objs, gather, parts[len(parts)-1], len(p.Runs))
	wg.Wait()
	return errors.Join(append(errs, err)...)
}

// runRange copies Runs[lo:hi]; a fault on a truncated segment becomes an
// error here (SetPanicOnFault is per goroutine), not a crash.
func (c *Cache) runRange(p *kvlayout.Plan, objs [][]byte, gather bool, lo, hi int) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrFault, r)
		}
	}()
	switch {
	case haveStream && p.Bytes >= StreamMinBytes:
		streamRuns(p.Runs[lo:hi], c.maps, objs, gather)
	case gather:
		p.GatherRange(c.maps, objs, lo, hi)
	default:
		p.ScatterRange(c.maps, objs, lo, hi)
	}
	return nil
}

// StreamMinBytes is the request size from which copies run through the
// streaming kernel (amd64 with AVX2): non-temporal stores skip reading
// every destination line before overwriting it, and software prefetch
// covers the strided rows of HND layouts that the hardware prefetcher
// misses. A request this large does not stay in the cache anyway; below
// it plain copy() keeps the bytes cached for whoever reads them next.
const StreamMinBytes = 1 << 20

// streamRun is one run as the kernel reads it (copy_amd64.s relies on
// this layout: six words, in this order).
type streamRun struct {
	dst, src, n, count, dstStep, srcStep uintptr
}

// StreamBatch is how many runs one kernel call walks: enough that the
// kernel's prefetch cursor runs ahead across run boundaries nearly all
// the time, small enough to live on the caller's stack.
const StreamBatch = 64

// StreamAhead is how many rows ahead of the copy the kernel prefetches
// when a batch reads strided rows (HND's retrieve: 256-byte rows 2 KiB
// apart in the object). Batches whose rows are all contiguous on the
// source side (HND's store, NHD both ways) prefetch nothing: the
// hardware prefetcher follows them, and software prefetch there only
// costs. BenchmarkStreamAhead measures 0 to 32 rows on the HND request.
const StreamAhead = 16

// streamRuns is the streaming form of kvlayout's GatherRange and
// ScatterRange for runs the caller has checked: runs whose destination
// address, step and length are 32-byte multiples go to the kernel in
// batches of StreamBatch (when the CPU has it), prefetched StreamAhead
// rows ahead when the batch has a strided source; any other run is
// copied with copy() per row, in plan order.
func streamRuns(runs []kvlayout.Run, segs, objs [][]byte, gather bool) {
	streamRunsAhead(runs, segs, objs, gather, StreamAhead)
}

// streamRunsAhead is streamRuns with the prefetch distance for strided
// batches given (0: never prefetch). The batch holds raw addresses: the
// segments are mappings and the objects heap slices the caller keeps
// alive, neither of which moves.
func streamRunsAhead(runs []kvlayout.Run, segs, objs [][]byte, gather bool, ahead uintptr) {
	var batch [StreamBatch]streamRun
	n, strided := 0, false
	flush := func() {
		if n > 0 {
			a := uintptr(0)
			if strided {
				a = ahead
			}
			copyRuns(&batch[0], uintptr(n), a)
			n, strided = 0, false
		}
	}
	for _, r := range runs {
		if r.Len == 0 || r.Count == 0 {
			continue
		}
		dst, do, ds, src, so, ss := segs[r.Seg], r.SegOff, r.SegStep, objs[r.Obj], r.ObjOff, r.ObjStep
		if gather {
			dst, do, ds, src, so, ss = objs[r.Obj], r.ObjOff, r.ObjStep, segs[r.Seg], r.SegOff, r.SegStep
		}
		d := unsafe.Pointer(&dst[do])
		if haveStream && (uintptr(d)|uintptr(r.Len)|uintptr(ds))%32 == 0 {
			batch[n] = streamRun{dst: uintptr(d), src: uintptr(unsafe.Pointer(&src[so])), n: uintptr(r.Len),
				count: uintptr(r.Count), dstStep: uintptr(ds), srcStep: uintptr(ss)}
			strided = strided || (r.Count > 1 && ss != r.Len)
			if n++; n == len(batch) {
				flush()
			}
			continue
		}
		flush()
		for range r.Count {
			copy(dst[do:do+r.Len], src[so:so+r.Len])
			do, so = do+ds, so+ss
		}
	}
	flush()
}

// ParallelMinBytes is the request size from which a copy is split over
// several goroutines, and the least each one copies: below it the
// hand-off costs more than it saves.
const ParallelMinBytes = 4 << 20

// MaxCopyWorkers bounds the goroutines one request copies with.
const MaxCopyWorkers = 8

func copyWorkers(n int64) int {
	return int(max(1, min(int64(runtime.GOMAXPROCS(0)), MaxCopyWorkers, n/ParallelMinBytes)))
}

// split cuts the plan's runs into k ranges of about equal bytes and
// returns each range's first run index (parts[0] = 0).
func split(p *kvlayout.Plan, k int) []int {
	parts := []int{0}
	if k <= 1 {
		return parts
	}
	per, acc := p.Bytes/int64(k), int64(0)
	for i, r := range p.Runs {
		acc += r.Len * r.Count
		if acc >= per*int64(len(parts)) && len(parts) < k && i+1 < len(p.Runs) {
			parts = append(parts, i+1)
		}
	}
	return parts
}

// Close unmaps the segments once running copies finish. It is idempotent.
func (c *Cache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.unmap()
}

func (c *Cache) unmap() error {
	var errs []error
	for _, m := range c.maps {
		if err := unix.Munmap(m); err != nil {
			errs = append(errs, err)
			continue
		}
		openMaps.Add(-1)
	}
	c.maps = nil
	return errors.Join(errs...)
}

// Block returns a copy of block id of layer li (K rows then V rows, as
// stored; see kvlayout.Layout.BlockExtents).
func (c *Cache) Block(li int, id int64) (_ []byte, err error) {
	ext, err := c.Layout.BlockExtents(li, id)
	if err != nil {
		return nil, err
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return nil, ErrClosed
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrFault, r)
		}
	}()
	var n int64
	for _, e := range ext {
		if e.Seg >= len(c.maps) || e.Off < 0 || e.Off+e.Len > int64(len(c.maps[e.Seg])) {
			return nil, fmt.Errorf("%w: block %d of layer %d lies outside its segment", ErrSegment, id, li)
		}
		n += e.Len
	}
	out := make([]byte, 0, n)
	for _, e := range ext {
		out = append(out, c.maps[e.Seg][e.Off:e.Off+e.Len]...)
	}
	return out, nil
}
