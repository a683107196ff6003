package ledger

import (
	"context"
	"time"
	"unsafe"
)

// The reserve keeps the kernel's page faults off the ingest path.
//
// Fresh anonymous memory is mapped by the kernel page by page on first
// write, and each of those faults zeroes a 4 KiB page: 1-2 us on an idle
// machine, about 18 us on the development VM when the host backs the page
// for the first time. A new 5 MiB entry page is 1,280 such pages; when the
// Go allocator hands back memory it must zero, it clears the whole page at
// once, faulting all of them inside the one request that needed a new page
// (about 23 ms at 18 us a fault), and otherwise the stores fault them one
// by one as they fill the page. The next index table (up to 512 MiB) was
// faulted by the stores that prefaulted it. Measured with perf at 10M keys:
// 193,658 faults inside Apply before, 3 with the reserve (BENCHMARKS.md).
//
// So the memory the ingest path will need next is prepared ahead, by
// Refill on a background goroutine and without the lock: one spare entry
// page, and the next index table once the index is half full (growth
// starts at 3/4, so an eighth of the index's size in stores passes before
// the fallback below would be needed). Refill allocates and writes every
// memory page of them; alloc and storeH only take what is ready. When
// nothing is ready (no refill loop, or it fell behind) they allocate under
// the lock as before, and count it in Reserve's Cold fields.

// osPage is the kernel page size the prefault loops step by (4 KiB on
// amd64 and arm64 Linux; a larger page only makes them write some pages
// twice).
const osPage = 4096

// refillChunk and refillPause pace Refill: it faults in refillChunk bytes
// (256 pages, about 0.3-5 ms of kernel time) and then pauses, so that
// preparing a 512 MiB table does not hold a CPU for 0.2-2.4 s on end while
// requests and the other processes of a small machine wait for one. At a
// quarter of a core or less, the largest table (512 MiB, for 25M-50M
// keys) takes under a second of the seconds its window lasts.
const (
	refillChunk = 1 << 20
	refillPause = time.Millisecond
)

// refillYield is the longest Refill waits, before each chunk, for the
// ingest requests in flight (IngestStarted to IngestDone) to finish. On
// a 2-core machine a chunk faulted in while a request decodes and applies
// its batch takes the core the request, or its client, would run on next.
// Under ingest that never pauses (several requests in flight) waiting
// would hold the reserve to refillChunk per refillPause+refillYield, too
// slow for a table's window, so Refill yields only in the first half of
// the window it has (see touch's urgent) and then goes ahead as before. A
// chunk that waited the whole cap is counted (ReserveStats.YieldCapped).
// On the paravirtualized development VM, to 20M keys in three alternating
// pairs of runs, yielding had fewer requests over 10 ms (115-125 against
// 131-141) and more events/s (312-315k against 291-311k) with one request
// in flight, and 519-543k against 441-495k events/s with four (two runs
// each), where 7 of the 16 index tables were allocated on the ingest path
// against 5 (BENCHMARKS.md, coordinator section 4).
const refillYield = 10 * time.Millisecond

// touch writes a zero into every memory page of b, so the kernel maps them
// now (a read would map the shared zero page and fault again on the first
// write), pausing refillPause after every refillChunk and then calling
// between (when not nil; false stops it, as ctx ending does). Before every
// chunk it yields to ingest (see yield) unless urgent reports that the
// ingest path is half way to needing the memory (then the chunks go
// ahead, paced only by refillPause). It returns false, leaving the rest
// untouched, when stopped.
func (l *Ledger) touch(ctx context.Context, b []byte, between, urgent func() bool) bool {
	var pause *time.Timer
	for off := 0; off < len(b); off += refillChunk {
		if !urgent() && !l.yield(ctx) {
			return false
		}
		if off > 0 {
			if pause == nil {
				pause = time.NewTimer(refillPause)
				defer pause.Stop()
			} else {
				pause.Reset(refillPause)
			}
			select {
			case <-pause.C:
			case <-ctx.Done():
				return false
			}
			if between != nil && !between() {
				return false
			}
		}
		c := b[off:min(off+refillChunk, len(b))]
		for i := 0; i < len(c); i += osPage {
			c[i] = 0
		}
		c[len(c)-1] = 0
	}
	return true
}

// IngestStarted marks an ingest request in flight, from before its body is
// decoded, so Refill leaves the CPU to it (see refillYield); pair it with
// IngestDone. Safe from any goroutine, without the lock.
func (l *Ledger) IngestStarted() { l.ingesting.Add(1) }

// IngestDone ends what IngestStarted began and, when no request is left in
// flight, wakes a Refill waiting in yield.
func (l *Ledger) IngestDone() {
	if l.ingesting.Add(-1) == 0 {
		select {
		case l.quiet <- struct{}{}:
		default:
		}
	}
}

// Ingesting is the number of ingest requests in flight (IngestStarted
// calls not yet ended by IngestDone).
func (l *Ledger) Ingesting() int { return int(l.ingesting.Load()) }

// yield waits while ingest requests are in flight, at most refillYield,
// and reports false when ctx ended. A token left in quiet by an earlier
// IngestDone only costs one more look at the count.
func (l *Ledger) yield(ctx context.Context) bool {
	if l.ingesting.Load() == 0 {
		return ctx.Err() == nil
	}
	l.yieldWaits.Add(1)
	limit := time.NewTimer(refillYield)
	defer limit.Stop()
	for l.ingesting.Load() > 0 {
		select {
		case <-l.quiet:
		case <-limit.C:
			l.yieldCapped.Add(1)
			return ctx.Err() == nil
		case <-ctx.Done():
			return false
		}
	}
	return ctx.Err() == nil
}

func entryBytes(p []entry) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&p[0])), len(p)*int(unsafe.Sizeof(entry{})))
}

func tableBytes(t []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&t[0])), len(t)*8)
}

// ReserveStats is the state of the reserve.
type ReserveStats struct {
	// SparePage is whether a prepared entry page is ready.
	SparePage bool
	// PreparedPages and PreparedTables count what Refill prepared and
	// the ledger took or holds.
	PreparedPages, PreparedTables uint64
	// ColdPages and ColdTables count entry pages and next index tables
	// the ingest path had to allocate itself (under the lock, faulting
	// on first write) because the reserve had none ready.
	ColdPages, ColdTables uint64
	// YieldWaits counts the chunks Refill held back while ingest requests
	// were in flight; YieldCapped those of them that went ahead after
	// refillYield with requests still in flight (ingest that never
	// paused).
	YieldWaits, YieldCapped uint64
}

// Reserve reports the reserve's counters.
func (l *Ledger) Reserve() ReserveStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ReserveStats{SparePage: l.spare != nil, PreparedPages: l.preparedPages, PreparedTables: l.preparedTables,
		ColdPages: l.coldPages, ColdTables: l.coldTables, YieldWaits: l.yieldWaits.Load(), YieldCapped: l.yieldCapped.Load()}
}

// wake tells the refill loop the reserve needs work; must hold mu. The
// channel holds one token, so a wake-up already pending is enough.
func (l *Ledger) wake() {
	select {
	case l.need <- struct{}{}:
	default:
	}
}

// WaitNeed blocks until the reserve may need a refill, at most d, or
// until ctx ends. A refill loop calls it between Refills; it returns at
// once the first time.
func (l *Ledger) WaitNeed(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.need:
	case <-t.C:
	case <-ctx.Done():
	}
}

// wantTable is the size of the next index table Refill should prepare, 0
// when none is wanted: from half full, when no migration is running and
// no next table exists. Must hold mu.
func (l *Ledger) wantTable() int {
	if l.next != nil || l.old != nil || uint64(l.live)*2 <= uint64(len(l.index)) {
		return 0
	}
	return 2 * len(l.index)
}

// Refill prepares what the reserve lacks: a spare entry page, and the next
// index table when one is wanted. Each is allocated and faulted in without
// the lock (holding it only to look and to hand the memory over), so
// ingest goes on meanwhile, and paced (see refillChunk). A table takes up
// to a few hundred chunks, during which ingest may use up several entry
// pages, so between its chunks Refill replaces a spare page that was
// taken. It reports what it handed over; when ctx ends it stops and hands
// over nothing more. Call it from one goroutine at a time (the
// coordinator's ledger-reserve loop).
func (l *Ledger) Refill(ctx context.Context) (pages, tables int) {
	if !l.refillPage(ctx, nil) {
		return 0, 0
	}
	pages = int(l.preparedNow.Swap(0))
	l.mu.Lock()
	want := l.wantTable()
	l.mu.Unlock()
	if want > 0 {
		t, sl := newTable(want)
		// The ingest path allocates a table itself once the index is 5/8
		// full (storeH); from 9/16, half way there, Refill stops yielding.
		urgent := func() bool { return uint64(l.liveHint.Load())*16 > uint64(want/2)*9 }
		ok := l.touch(ctx, tableBytes(t), func() bool { return l.refillPage(ctx, urgent) }, urgent)
		l.mu.Lock()
		if ok && l.wantTable() == want {
			l.next, l.nextSlab, l.nextFaulted = t, sl, len(t)
			l.preparedTables++
			tables++
			sl = nil
		}
		l.mu.Unlock()
		// Not wanted any more (the ingest path allocated its own meanwhile,
		// or deletes shrank the ledger), or ctx ended.
		sl.free()
		pages += int(l.preparedNow.Swap(0))
	}
	return pages, tables
}

// refillPage prepares a spare entry page unless one is ready (spareReady
// is read without the lock, so the check between a table's chunks does not
// wait for a batch to finish). tableUrgent, when not nil, is the urgency of
// the table whose chunks it runs between. It returns false when ctx ended.
func (l *Ledger) refillPage(ctx context.Context, tableUrgent func() bool) bool {
	if l.spareReady.Load() {
		return true
	}
	p, sl := newEntryPage()
	// The spare was taken when the page in use began; once that page is
	// half full, Refill stops yielding, and between an urgent table's
	// chunks it does not yield either.
	urgent := func() bool {
		return l.allocHint.Load()&(pageSize-1) >= pageSize/2 || (tableUrgent != nil && tableUrgent())
	}
	if !l.touch(ctx, entryBytes(p), nil, urgent) {
		sl.free()
		return false
	}
	l.mu.Lock()
	if l.spare == nil {
		l.spare, l.spareSlab = p, sl
		sl = nil
		l.spareReady.Store(true)
		l.preparedPages++
		l.preparedNow.Add(1)
	}
	l.mu.Unlock()
	sl.free() // nil when handed over
	return true
}

// newPage returns an entry page for alloc: the spare when one is ready
// (and wakes the refill loop to prepare the next), else a fresh one that
// faults on the ingest path. Must hold mu.
func (l *Ledger) newPage() ([]entry, *slab) {
	if p, sl := l.spare, l.spareSlab; p != nil {
		l.spare, l.spareSlab = nil, nil
		l.spareReady.Store(false)
		l.wake()
		return p, sl
	}
	l.coldPages++
	return newEntryPage()
}
