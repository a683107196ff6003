package engine

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/l1"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/tracing"
)

// Write-behind (upstream's StoreController with retries).
//
// Every committed, non-temporary object is uploaded to every adapter. The
// commit pins the object once per adapter (l1.CommitOpts.Pins), so it cannot
// be evicted, and its memory cannot be reused, until each adapter's upload
// has either landed or been abandoned. That is the answer to "an upload
// failed, may L1 drop the copy?": no, not while a retry is pending.
//
// Failed uploads are retried with exponential backoff (StoreRetryBase
// doubling up to StoreRetryMax) up to StoreMaxAttempts attempts per
// (object, adapter); then the upload is abandoned, counted in
// L2Counters.StoreAbandoned and logged, and the pin is dropped so L1 can
// evict the object normally. The bound exists because an L2 outage must not
// pin all of L1 forever: a full pool would reject every new store.
//
// Uploads still queued when Run returns are dropped (counted in
// Counters.StoreQueueDropped); L1 is volatile anyway.

const (
	storeWorkersPerAdapter = 2
	storeBatchObjects      = 32
	storeBatchBytes        = 256 << 20
)

// storeObj tracks one object across all adapters.
type storeObj struct {
	h         l1.Handle
	remaining atomic.Int32      // adapters not yet done with it
	failed    atomic.Bool       // some adapter abandoned it
	trace     trace.SpanContext // the request that stored it (tracing)
}

type storeItem struct {
	obj      *storeObj
	attempts int // failed attempts so far
	next     time.Time
}

// storeQueue is one adapter's queue: FIFO of ready items plus a min-heap of
// items backing off. Guarded by mu; wake (capacity 1) signals workers.
type storeQueue struct {
	mu      sync.Mutex
	ready   []*storeItem
	delayed delayHeap
	wake    chan struct{}
}

type delayHeap []*storeItem

func (h delayHeap) Len() int           { return len(h) }
func (h delayHeap) Less(i, j int) bool { return h[i].next.Before(h[j].next) }
func (h delayHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)        { *h = append(*h, x.(*storeItem)) }
func (h *delayHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

func (q *storeQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns a batch of ready items, or how long until the next delayed
// one is due (0: nothing delayed).
func (q *storeQueue) take(now time.Time) ([]*storeItem, time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.delayed.Len() > 0 && !q.delayed[0].next.After(now) {
		q.ready = append(q.ready, heap.Pop(&q.delayed).(*storeItem))
	}
	if len(q.ready) == 0 {
		if q.delayed.Len() > 0 {
			return nil, q.delayed[0].next.Sub(now)
		}
		return nil, 0
	}
	var bytes int64
	n := 0
	for n < len(q.ready) && n < storeBatchObjects {
		sz := q.ready[n].obj.h.Slot().Size
		if n > 0 && bytes+sz > storeBatchBytes {
			break
		}
		bytes += sz
		n++
	}
	batch := append([]*storeItem(nil), q.ready[:n]...)
	clear(q.ready[:n])
	q.ready = q.ready[n:]
	if len(q.ready) > 0 {
		q.signal() // let another worker take the rest
	}
	return batch, 0
}

type storeCtl struct {
	e  *Engine
	qs []*storeQueue
	// closeMu orders enqueue against shutdown: enqueue checks closed and
	// appends under the read lock, shutdown sets closed under the write
	// lock before draining, so no upload is stranded (pinned forever).
	closeMu sync.RWMutex
	closed  bool
}

func newStoreCtl(e *Engine) *storeCtl {
	s := &storeCtl{e: e, qs: make([]*storeQueue, len(e.adapters))}
	for i := range s.qs {
		s.qs[i] = &storeQueue{wake: make(chan struct{}, 1)}
	}
	return s
}

// enqueue queues freshly published objects (each pinned once per adapter).
func (s *storeCtl) enqueue(hs []l1.Handle, sc trace.SpanContext) {
	if len(s.qs) == 0 {
		return
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		for _, h := range hs {
			for range s.qs {
				s.e.table.Unpin(h)
			}
		}
		s.e.st.storeDropped.Add(int64(len(hs)))
		return
	}
	objs := make([]*storeObj, len(hs))
	keys := make([]objkey.Key, len(hs))
	for i, h := range hs {
		objs[i] = &storeObj{h: h, trace: sc}
		objs[i].remaining.Store(int32(len(s.qs)))
		keys[i] = h.Key()
	}
	s.e.st.storeSubObj.addKeys(keys, int64(len(s.qs)))
	for i, q := range s.qs {
		q.mu.Lock()
		for _, o := range objs {
			q.ready = append(q.ready, &storeItem{obj: o})
		}
		q.mu.Unlock()
		s.e.st.adapters[i].pendingStores.Add(int64(len(objs)))
		q.signal()
	}
}

// start registers and runs storeWorkersPerAdapter worker loops per
// adapter (LoopStorePrefix<i>-<n>, high: a store worker whose upload never
// returns pins L1 and turns /periodic-threads-health unhealthy).
func (s *storeCtl) start(ctx context.Context, wg *sync.WaitGroup) {
	for i := range s.qs {
		for n := range storeWorkersPerAdapter {
			name := fmt.Sprintf("%s%d-%d", LoopStorePrefix, i, n)
			l := s.e.cfg.Loops.RegisterWorker(name, periodic.High, s.e.cfg.WorkerLoopInterval, func(ctx context.Context) (periodic.Summary, error) {
				return s.cycle(ctx, i), nil
			})
			wg.Go(func() { l.Run(ctx) })
		}
	}
}

// cycle is one turn of a store worker of adapter i: upload one ready
// batch, or wait for work (a wake-up, the next delayed retry, or at most
// one loop interval, so an idle worker still reports runs). The loop
// checks ctx between cycles: after cancellation a failing upload requeues
// its batch at once, so waiting for an empty queue would never end.
func (s *storeCtl) cycle(ctx context.Context, i int) periodic.Summary {
	q := s.qs[i]
	batch, wait := q.take(time.Now())
	if len(batch) > 0 {
		s.upload(ctx, i, batch)
		return periodic.Summary{Message: "batch"}
	}
	d := s.e.cfg.WorkerLoopInterval
	if wait > 0 && wait < d {
		d = wait
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-q.wake:
	case <-t.C:
	}
	return periodic.Summary{Message: "idle"}
}

func (s *storeCtl) backoff(attempts int) time.Duration {
	d := s.e.cfg.StoreRetryBase
	for i := 1; i < attempts && d < s.e.cfg.StoreRetryMax; i++ {
		d *= 2
	}
	return min(d, s.e.cfg.StoreRetryMax)
}

func (s *storeCtl) upload(ctx context.Context, i int, batch []*storeItem) {
	e, q, st := s.e, s.qs[i], s.e.st.adapters[i]
	keys := make([]objkey.Key, len(batch))
	objs := make([][]byte, len(batch))
	var bytes int64
	var parents []trace.SpanContext
	for j, it := range batch {
		if it.obj.trace.IsValid() {
			parents = append(parents, it.obj.trace)
		}
		sl := it.obj.h.Slot()
		keys[j], objs[j] = it.obj.h.Key(), e.pool.Bytes(sl.Offset, sl.Size)
		bytes += sl.Size
		if it.attempts > 0 {
			st.storeRetried.Add(1)
		}
	}
	st.storeSubmitted.Add(1)
	st.inflightStores.Add(1)
	panicked, err := storeCall(tracing.Follow(ctx, parents...), e.adapters[i], keys, objs)
	st.inflightStores.Add(-1)
	if panicked != nil {
		// A panicking adapter fails this attempt like an error, so the
		// batch is retried or abandoned and its pins dropped; the panic
		// then goes on to the worker loop, which recovers and records it.
		defer panic(panicked)
	}
	if err == nil {
		// Pins go first, so whoever sees the completion counters move also
		// sees the objects' pending uploads settled.
		for _, it := range batch {
			s.done(i, it, true)
		}
		st.storeCompleted.Add(1)
		st.storeObjects.Add(int64(len(batch)))
		st.storeBytes.Add(bytes)
		e.st.storeDoneObj.addKeys(keys, 1)
		return
	}
	if ctx.Err() != nil {
		// Shutting down: put the batch back so shutdown accounts for it.
		q.mu.Lock()
		q.ready = append(q.ready, batch...)
		q.mu.Unlock()
		return
	}
	st.storeFailed.Add(1)
	now := time.Now()
	var retry []*storeItem
	for _, it := range batch {
		it.attempts++
		if it.attempts >= e.cfg.StoreMaxAttempts {
			st.storeAbandoned.Add(1)
			e.log.Warn("write-behind upload abandoned", "adapter", i, "key", it.obj.h.Key().String(), "attempts", it.attempts, "err", err)
			s.done(i, it, false)
			continue
		}
		it.next = now.Add(s.backoff(it.attempts))
		retry = append(retry, it)
	}
	if len(retry) > 0 {
		e.log.Debug("write-behind upload failed; will retry", "adapter", i, "objects", len(retry), "err", err)
		q.mu.Lock()
		for _, it := range retry {
			heap.Push(&q.delayed, it)
		}
		q.mu.Unlock()
		q.signal() // a sleeping worker must recompute its timer
	}
}

// storeCall is a.Store, with a panic in it recovered and returned (and
// described by err): the batch it was uploading is in no queue while the
// call runs, so a panic that unwound past upload would leave its objects
// pinned in L1 for good and the in-flight gauge raised.
func storeCall(ctx context.Context, a l2.Adapter, keys []objkey.Key, objs [][]byte) (panicked any, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked, err = r, fmt.Errorf("L2 store panicked: %v", r)
		}
	}()
	return nil, a.Store(ctx, keys, objs)
}

// done finishes one (object, adapter) upload: the adapter's pin is dropped,
// and under skip_l1 the L1 copy goes once every adapter holds the object.
func (s *storeCtl) done(i int, it *storeItem, ok bool) {
	e := s.e
	e.st.adapters[i].pendingStores.Add(-1)
	if !ok {
		it.obj.failed.Store(true)
	}
	e.table.Unpin(it.obj.h)
	if it.obj.remaining.Add(-1) == 0 && e.cfg.L2StorePolicy == StorePolicySkipL1 && !it.obj.failed.Load() {
		e.withEvents(func() {
			if e.table.DropIfIdle(it.obj.h) {
				e.deletedL1([]objkey.Key{it.obj.h.Key()})
			}
		})
	}
}

// shutdown drops whatever is still queued (after the workers stopped) and
// returns how many objects were affected.
func (s *storeCtl) shutdown() int {
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	dropped := map[*storeObj]struct{}{}
	for i, q := range s.qs {
		q.mu.Lock()
		items := append(q.ready, q.delayed...)
		q.ready, q.delayed = nil, nil
		q.mu.Unlock()
		for _, it := range items {
			dropped[it.obj] = struct{}{}
			s.e.st.adapters[i].pendingStores.Add(-1)
			s.e.table.Unpin(it.obj.h)
		}
	}
	s.e.st.storeDropped.Add(int64(len(dropped)))
	return len(dropped)
}

// counts returns queued (ready + backing off) uploads and the upload
// tasks (Store calls) in flight.
func (s *storeCtl) counts() (pending int, inflight int64) {
	for i, q := range s.qs {
		q.mu.Lock()
		pending += len(q.ready) + q.delayed.Len()
		q.mu.Unlock()
		inflight += s.e.st.adapters[i].inflightStores.Load()
	}
	return pending, inflight
}
