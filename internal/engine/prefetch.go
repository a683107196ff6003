package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/l1"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/tracing"
)

// Prefetch jobs (upstream's PrefetchController).
//
// Prefetch does the L1 part synchronously: resident keys are read-locked
// for the job's owner (its ID). Misses go to a bounded queue served by
// L2PrefetchMaxInFlight workers owned by Run. A worker asks each adapter in
// index order for the keys nobody has served yet (the first adapter holding
// a key serves it), reserves private L1 staging buffers for the hits (all
// or nothing), loads into them, commits them (read-locked for the owner in
// the same critical section, temporary unless retained) and unlocks the L2
// side. Then the result is published and the job's done channel closed.
//
// Exactly-once completion: a finished job is removed from the table by the
// first PollPrefetch/WaitPrefetch that sees it done, under the jobs mutex;
// every later call gets ErrNotFound.
//
// Dropped work, documented and counted: a job whose L2 phase does not fit
// in the queue completes with its L1 result (Counters.PrefetchDropped);
// finished jobs nobody polls for prefetchResultTTL are discarded
// (Counters.PrefetchReaped) so abandoned warm prefetches do not accumulate,
// and so is the oldest finished one when more than maxUnpolledJobs wait (a
// client sending a new request id per lookup and never polling would
// otherwise hold one per id for the whole TTL).
// Neither drops a read lock: locks end by release or by lease expiry.

const (
	prefetchQueueCap  = 4096
	prefetchResultTTL = 10 * time.Minute
	// maxUnpolledJobs bounds the finished jobs waiting for their poll;
	// vLLM polls each lookup at once, so only abandoned ones pile up.
	maxUnpolledJobs = 65536
)

type job struct {
	req     PrefetchRequest
	owner   string // "" when Readers == 0
	retain  bool
	total   int          // keys requested
	hit     []bool       // per key, chunk-major: resident (and locked for owner when Readers > 0)
	flat    []objkey.Key // L2 phase only: the keys, chunk-major
	chunkOf []int        // L2 phase only: chunk index per key
	fromL1  []bool       // L2 phase only: hit as the L1 phase left it
	l2Keys  int
	err     error

	submitted time.Time // when Prefetch was called: the lookup budget counts from here

	done   chan struct{}
	res    PrefetchResult
	doneAt time.Time
	// Guarded by prefetchCtl.mu: the lookup phase's answer, published
	// before L2 loads start.
	lookupDone   bool
	lookupPrefix int
	// listed: finished, still in the jobs table, and counted in
	// prefetchCtl.unpolled (guarded by prefetchCtl.mu).
	listed bool
}

type prefetchCtl struct {
	e      *Engine
	queue  chan *job
	mu     sync.Mutex
	jobs   map[string]*job
	closed bool // set by shutdown; no job is queued afterwards
	// finished lists jobs in the order they finished, oldest first, so
	// the oldest unpolled one is dropped first past maxUnpolled. Entries
	// of jobs consumed or replaced since (listed false) are skipped when
	// met and pruned by reap; unpolled counts the listed ones.
	finished    []finishedJob
	unpolled    int
	maxUnpolled int
}

type finishedJob struct {
	id string
	j  *job
}

func newPrefetchCtl(e *Engine) *prefetchCtl {
	return &prefetchCtl{e: e, queue: make(chan *job, prefetchQueueCap), jobs: map[string]*job{}, maxUnpolled: maxUnpolledJobs}
}

// Prefetch starts a job: L1 hits are read-locked at once (Readers > 0), L2
// hits are loaded into L1 in the background. Observe it with PollPrefetch
// or WaitPrefetch. Only ErrInvalid/ErrClosed are returned synchronously.
func (e *Engine) Prefetch(req PrefetchRequest) error {
	if e.stopped.Load() {
		return ErrClosed
	}
	if req.ID == "" {
		return fmt.Errorf("%w: prefetch needs an id", ErrInvalid)
	}
	if req.Readers < 0 {
		return fmt.Errorf("%w: negative reader count", ErrInvalid)
	}
	j := &job{req: req, retain: req.Retain || req.Readers == 0 || e.cfg.L2PrefetchPolicy == PrefetchPolicyRetain, done: make(chan struct{}), submitted: time.Now()}
	for _, ks := range req.Chunks {
		j.total += len(ks)
	}
	// The L1 phase works on req.Chunks directly; the flattened key list the
	// L2 phase needs is built by the worker, only when there are misses.
	j.hit = make([]bool, j.total)
	var hits int
	if req.Readers > 0 {
		j.owner = req.ID
		if hits = e.table.ReadLockChunks(j.owner, req.Chunks, req.Readers, j.hit); hits > 0 {
			e.st.l1Read.addMasked(req.Chunks, j.hit)
			if e.hasListeners() {
				var accessed []objkey.Key
				i := 0
				for _, ks := range req.Chunks {
					for _, k := range ks {
						if j.hit[i] {
							accessed = append(accessed, k)
						}
						i++
					}
				}
				e.notify(func(l L1Listener) { l.OnL1Accessed(accessed) })
			}
		}
	} else {
		hits = e.table.ContainsChunks(req.Chunks, j.hit)
	}
	e.st.prefetchRequests.Add(1)
	e.st.activeJobs.Add(1)

	p := e.pf
	missing := hits < j.total
	// A newer job replaces an unconsumed one of the same id. Both lock for
	// the same owner name, which is safe: each job only ever releases
	// locks it took itself, so the owner's count stays exact. Queueing
	// happens under p.mu so that shutdown (which sets closed under p.mu,
	// then drains) cannot miss a job.
	queued := false
	p.mu.Lock()
	if old := p.jobs[req.ID]; old != nil {
		p.unlistLocked(old)
	}
	p.jobs[req.ID] = j
	if missing && len(e.adapters) > 0 && !p.closed {
		select {
		case p.queue <- j:
			queued = true
		default:
			e.st.prefetchDropped.Add(1)
		}
	}
	p.mu.Unlock()
	if !queued {
		e.finishJob(j)
	}
	return nil
}

// start registers and runs L2PrefetchMaxInFlight worker loops
// (LoopPrefetchPrefix<n>, medium: a job may legitimately wait on a long
// L2 load). A cycle runs one queued job or waits one loop interval.
func (p *prefetchCtl) start(ctx context.Context, wg *sync.WaitGroup) {
	for n := range p.e.cfg.L2PrefetchMaxInFlight {
		name := LoopPrefetchPrefix + strconv.Itoa(n)
		l := p.e.cfg.Loops.RegisterWorker(name, periodic.Medium, p.e.cfg.WorkerLoopInterval, func(ctx context.Context) (periodic.Summary, error) {
			return p.cycle(ctx), nil
		})
		wg.Go(func() { l.Run(ctx) })
	}
}

func (p *prefetchCtl) cycle(ctx context.Context) periodic.Summary {
	t := time.NewTimer(p.e.cfg.WorkerLoopInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case j := <-p.queue:
		p.e.runJob(ctx, j)
		return periodic.Summary{Message: "job"}
	case <-t.C:
	}
	return periodic.Summary{Message: "idle"}
}

// shutdown completes queued jobs with their L1 result after the workers
// stopped, so no waiter blocks forever.
func (p *prefetchCtl) shutdown() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	for {
		select {
		case j := <-p.queue:
			j.err = ErrClosed
			p.e.finishJob(j)
		default:
			return
		}
	}
}

// runJob is the L2 phase of one job; the L2 locks are released before the
// job is published as done.
func (e *Engine) runJob(ctx context.Context, j *job) {
	defer func() {
		// However the L2 phase ends: a panic in an adapter (the worker
		// loop recovers it and records it) must still complete the job,
		// or its waiter (a vLLM LOOKUP) would never get an answer.
		if r := recover(); r != nil {
			j.err = fmt.Errorf("prefetch L2 phase panicked: %v", r)
			e.finishJob(j)
			panic(r)
		}
		e.finishJob(j)
	}()
	e.loadL2(ctx, j)
}

func (e *Engine) loadL2(ctx context.Context, j *job) {
	ctx = tracing.Follow(ctx, j.req.Trace)
	j.flat = make([]objkey.Key, 0, j.total)
	j.chunkOf = make([]int, 0, j.total)
	for c, ks := range j.req.Chunks {
		j.flat = append(j.flat, ks...)
		for range ks {
			j.chunkOf = append(j.chunkOf, c)
		}
	}
	j.fromL1 = slices.Clone(j.hit)
	if t := e.cfg.L2PrefetchLoadTimeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	var remaining []int
	for i, h := range j.hit {
		if !h {
			remaining = append(remaining, i)
		}
	}
	// Lookup-and-lock, first adapter holding a key serves it. A lookup
	// asks under its budget (see Config.L2LookupTimeout); a job whose
	// budget ran out in the queue asks no adapter at all.
	lctx := ctx
	if b := e.cfg.L2LookupTimeout; b > 0 && j.req.Readers > 0 && !j.req.Sparse {
		var cancel context.CancelFunc
		lctx, cancel = context.WithDeadline(ctx, j.submitted.Add(b))
		defer cancel()
	}
	budgetSpent := func() bool { return lctx.Err() != nil && ctx.Err() == nil }
	locked := make([][]int, len(e.adapters))
	found := make([]bool, len(j.flat))
	timedOut := false
	for ai, a := range e.adapters {
		if len(remaining) == 0 {
			break
		}
		if budgetSpent() {
			timedOut = true
			break
		}
		keys := j.keysAt(remaining)
		e.st.l2Lookup.Add(1)
		e.st.l2LookupObj.addKeys(keys, 1)
		hits, err := a.LookupAndLock(lctx, keys)
		if budgetSpent() {
			// Keys the adapter did confirm (and lock) still count; the
			// ones it could not answer in time are misses.
			timedOut = true
			err = nil
		}
		if errors.Is(err, l2.ErrUnavailable) {
			// Circuit-broken (or closed): a known state the adapter's
			// status reports, not a failed lookup, so the job answers with
			// the other tiers and no error (Counters.L2LookupUnavailable).
			e.st.lookupUnavailable.Add(1)
			continue
		}
		if err != nil {
			e.log.Debug("prefetch: L2 lookup failed", "adapter", ai, "err", err)
			j.err = err
			continue
		}
		var rest []int
		for n, idx := range remaining {
			if n < len(hits) && hits[n] {
				locked[ai] = append(locked[ai], idx)
				found[idx] = true
			} else {
				rest = append(rest, idx)
			}
		}
		remaining = rest
	}
	if timedOut {
		e.st.lookupTimeouts.Add(1)
		e.log.Debug("prefetch: L2 lookup budget spent; answering with what the tiers said so far", "request_id", j.req.ID, "budget", e.cfg.L2LookupTimeout)
	}
	defer func() {
		for ai, idx := range locked {
			if len(idx) > 0 {
				e.adapters[ai].Unlock(j.keysAt(idx))
			}
		}
	}()
	// For a prefix lookup only chunks before the first chunk that neither
	// tier completes are worth loading.
	lookupPrefix := j.prefix(func(i int) bool { return j.hit[i] || found[i] })
	e.pf.mu.Lock()
	j.lookupDone, j.lookupPrefix = true, lookupPrefix
	e.pf.mu.Unlock()
	limit := len(j.req.Chunks)
	if !j.req.Sparse {
		limit = lookupPrefix
	}
	var loadIdx []int
	var sizes []int64
	for ai := range locked {
		for _, idx := range locked[ai] {
			if j.chunkOf[idx] >= limit {
				continue
			}
			sz, err := e.objectSize(j.flat[idx])
			if err != nil {
				j.err = err
				continue
			}
			loadIdx = append(loadIdx, idx)
			sizes = append(sizes, sz)
		}
	}
	if len(loadIdx) == 0 {
		return
	}
	tag := "prefetch\x00" + j.req.ID + "\x00" + strconv.FormatUint(e.seq.Add(1), 10)
	// Held: this job commits or aborts every buffer once its loads
	// return, and the adapters write into them until then, so no write
	// lease may reclaim one meanwhile.
	held := j.keysAt(loadIdx)
	slots, err := e.table.ReserveHeld(tag, held, sizes)
	if err != nil {
		e.st.allocFailPrefetch.Add(1)
		j.err = mapErr(err)
		return
	}
	// loadFrom commits or aborts each buffer; this catches those it never
	// reached (an adapter's Load that panicked, recovered by the worker
	// loop): held buffers have no lease that would reclaim them. Abort
	// skips the keys already committed.
	defer e.table.Abort(tag, held)
	slotOf := make(map[int]l1.Slot, len(loadIdx))
	var already []int // became resident meanwhile: lock the resident copy
	for n, idx := range loadIdx {
		if slots[n].Size > 0 {
			slotOf[idx] = slots[n]
		} else {
			already = append(already, idx)
		}
	}
	for ai, idxs := range locked {
		var keys []objkey.Key
		var dst [][]byte
		var which []int
		for _, idx := range idxs {
			s, ok := slotOf[idx]
			if !ok {
				continue
			}
			keys = append(keys, j.flat[idx])
			dst = append(dst, e.pool.Bytes(s.Offset, s.Size))
			which = append(which, idx)
		}
		if len(keys) == 0 {
			continue
		}
		e.loadFrom(ctx, ai, j, tag, keys, dst, which)
	}
	if len(already) > 0 {
		keys := j.keysAt(already)
		if j.owner != "" {
			for n, s := range e.table.ReadLock(j.owner, keys, j.req.Readers) {
				j.hit[already[n]] = s.Size > 0
			}
		} else {
			for n, ok := range e.table.Contains(keys) {
				j.hit[already[n]] = ok
			}
		}
	}
}

// loadFrom loads keys from adapter ai into their staging buffers and
// commits what arrived.
func (e *Engine) loadFrom(ctx context.Context, ai int, j *job, tag string, keys []objkey.Key, dst [][]byte, which []int) {
	st := e.st.adapters[ai]
	e.st.l2LoadSub.Add(1)
	e.st.l2LoadSubObj.addKeys(keys, 1)
	st.inflightLoads.Add(1)
	lctx := ctx
	if j.req.Readers > 0 && !j.req.Sparse {
		// A lookup is waiting: an adapter call that stalls past its
		// slow-call limit is abandoned rather than awaited to its timeout.
		lctx = l2.WithFailSlow(ctx)
	}
	ok, err := e.adapters[ai].Load(lctx, keys, dst)
	st.inflightLoads.Add(-1)
	if err != nil {
		st.loadFailed.Add(1)
		// An unavailable adapter (its breaker opened, aborting the load)
		// is a known state, as in the lookup step: the job answers with
		// what the other tiers hold, without an error.
		if !errors.Is(err, l2.ErrUnavailable) {
			j.err = err
		}
		ok = nil
	} else {
		st.loadCompleted.Add(1)
	}
	var good, bad []objkey.Key
	pos := map[objkey.Key]int{}
	for n, k := range keys {
		if n < len(ok) && ok[n] {
			good = append(good, k)
			pos[k] = which[n]
			st.loadObjects.Add(1)
			st.loadBytes.Add(int64(len(dst[n])))
		} else {
			bad = append(bad, k)
		}
	}
	e.table.Abort(tag, bad)
	if len(good) == 0 {
		return
	}
	var res l1.CommitResult
	var skeys []objkey.Key
	e.withEvents(func() {
		res = e.table.Commit(tag, good, l1.CommitOpts{Temporary: !j.retain, Readers: j.req.Readers, Owner: j.owner})
		skeys = make([]objkey.Key, len(res.Published))
		sizes := make([]int64, len(res.Published))
		for n, h := range res.Published {
			skeys[n], sizes[n] = h.Key(), h.Slot().Size
		}
		if len(skeys) > 0 {
			e.notify(func(l L1Listener) { l.OnL1Stored(skeys, sizes) })
		}
	})
	e.st.l1Write.addKeys(skeys, 1)
	e.st.l2LoadDone.addKeys(skeys, 1)
	j.l2Keys += len(res.Published)
	if j.owner != "" {
		for _, k := range res.Locked {
			j.hit[pos[k]] = true
		}
		return
	}
	for n, in := range e.table.Contains(good) {
		j.hit[pos[good[n]]] = in
	}
}

func (j *job) keysAt(idx []int) []objkey.Key {
	out := make([]objkey.Key, len(idx))
	for n, i := range idx {
		out[n] = j.flat[i]
	}
	return out
}

// prefix counts leading chunks whose every key (index chunk-major)
// satisfies ok. A chunk with no keys ends the prefix.
func (j *job) prefix(ok func(int) bool) int {
	i := 0
	for c, ks := range j.req.Chunks {
		if len(ks) == 0 {
			return c
		}
		for range ks {
			if !ok(i) {
				return c
			}
			i++
		}
	}
	return len(j.req.Chunks)
}

// finishJob computes the result, releases locks beyond a lookup's prefix
// and wakes waiters.
func (e *Engine) finishJob(j *job) {
	prefix := j.prefix(func(i int) bool { return j.hit[i] })
	if j.owner != "" && !j.req.Sparse && prefix < len(j.req.Chunks) {
		var beyond []objkey.Key
		i := 0
		for c, ks := range j.req.Chunks {
			for _, k := range ks {
				if c >= prefix && j.hit[i] {
					beyond = append(beyond, k)
				}
				i++
			}
		}
		if len(beyond) > 0 {
			e.ReleaseRead(j.owner, beyond, j.req.Readers)
		}
	}
	fromL1 := j.fromL1
	if fromL1 == nil { // no L2 phase: everything found came from L1
		fromL1 = j.hit
	}
	l1Chunks := j.prefix(func(i int) bool { return fromL1[i] })
	e.st.hitL1.Add(int64(min(l1Chunks, prefix)))
	e.st.hitL2.Add(int64(prefix - min(l1Chunks, prefix)))
	e.st.miss.Add(int64(len(j.req.Chunks) - prefix))
	l1Keys := 0
	for _, v := range fromL1 {
		if v {
			l1Keys++
		}
	}
	p := e.pf
	p.mu.Lock()
	if !j.lookupDone {
		j.lookupDone, j.lookupPrefix = true, prefix
	}
	j.doneAt = time.Now()
	j.res = PrefetchResult{Done: true, LookupDone: true, LookupPrefixChunks: j.lookupPrefix, PrefixChunks: prefix, TotalKeys: j.total, L1Keys: l1Keys, L2Keys: j.l2Keys, Err: j.err, Duration: j.doneAt.Sub(j.submitted)}
	if p.jobs[j.req.ID] == j { // not replaced by a newer job of its id
		p.listLocked(j)
	}
	p.mu.Unlock()
	// A done job waits up to prefetchResultTTL for its poll (a warm
	// prefetch may never be polled); it needs only its result, so the
	// request's keys and the per-key state are let go now rather than
	// held, hundreds of bytes a key, until the reaper.
	j.req.Chunks, j.hit, j.flat, j.chunkOf, j.fromL1 = nil, nil, nil, nil, nil
	e.st.activeJobs.Add(-1)
	close(j.done)
}

func errUnknownJob(id string) error {
	return fmt.Errorf("%w: unknown prefetch request_id='%s' (already completed or never submitted)", ErrNotFound, id)
}

// jobState returns job id's result; a done job is forgotten when consume is
// set (PollPrefetch) and kept otherwise (PeekPrefetch).
func (p *prefetchCtl) jobState(id string, consume bool) (PrefetchResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	j, ok := p.jobs[id]
	if !ok {
		return PrefetchResult{}, errUnknownJob(id)
	}
	select {
	case <-j.done:
		if consume {
			delete(p.jobs, id)
			p.unlistLocked(j)
		}
		return j.res, nil
	default:
		return PrefetchResult{LookupDone: j.lookupDone, LookupPrefixChunks: j.lookupPrefix}, nil
	}
}

// WaitPrefetch blocks until the job is done (consuming it, exactly once) or
// ctx ends (the job is kept; the error wraps ctx.Err()).
func (e *Engine) WaitPrefetch(ctx context.Context, id string) (PrefetchResult, error) {
	p := e.pf
	p.mu.Lock()
	j, ok := p.jobs[id]
	p.mu.Unlock()
	if !ok {
		return PrefetchResult{}, errUnknownJob(id)
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		return PrefetchResult{}, fmt.Errorf("waiting for prefetch %s: %w", id, ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.jobs[id] != j {
		return PrefetchResult{}, fmt.Errorf("%w: prefetch request_id='%s' already consumed", ErrNotFound, id)
	}
	delete(p.jobs, id)
	p.unlistLocked(j)
	return j.res, nil
}

// reap discards finished jobs nobody consumed within prefetchResultTTL and
// prunes the finished list of jobs no longer listed.
func (p *prefetchCtl) reap(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, j := range p.jobs {
		select {
		case <-j.done:
			if now.Sub(j.doneAt) > prefetchResultTTL {
				delete(p.jobs, id)
				p.unlistLocked(j)
				p.e.st.prefetchReaped.Add(1)
			}
		default:
		}
	}
	p.pruneFinishedLocked()
}

// listLocked records a finished job still in the table as waiting for its
// poll and, past maxUnpolled waiting, discards the oldest (counted in
// PrefetchReaped, as the TTL's discards). Its read locks stay until
// released or expired, as for a job the TTL discards.
func (p *prefetchCtl) listLocked(j *job) {
	j.listed = true
	p.unpolled++
	p.finished = append(p.finished, finishedJob{j.req.ID, j})
	for p.unpolled > p.maxUnpolled && len(p.finished) > 0 {
		f := p.finished[0]
		p.finished[0] = finishedJob{}
		p.finished = p.finished[1:]
		if f.j.listed {
			delete(p.jobs, f.id)
			p.unlistLocked(f.j)
			p.e.st.prefetchReaped.Add(1)
		}
	}
	// Consumed jobs leave their entries behind; reap prunes them every
	// tick, and this bounds them should a burst outpace it.
	if len(p.finished) > 4*p.maxUnpolled {
		p.pruneFinishedLocked()
	}
}

// unlistLocked forgets that j waits for its poll (it was consumed,
// replaced or discarded).
func (p *prefetchCtl) unlistLocked(j *job) {
	if j.listed {
		j.listed = false
		p.unpolled--
	}
}

// pruneFinishedLocked drops the entries of jobs no longer listed, into a
// fresh slice so the space before the oldest entry is given back.
func (p *prefetchCtl) pruneFinishedLocked() {
	if len(p.finished) == p.unpolled {
		return // nothing to drop
	}
	kept := make([]finishedJob, 0, p.unpolled)
	for _, f := range p.finished {
		if f.j.listed {
			kept = append(kept, f)
		}
	}
	p.finished = kept
}
