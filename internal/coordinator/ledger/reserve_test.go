package ledger

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noHugePages turns transparent huge pages off for this process until the
// test ends (prctl PR_SET_THP_DISABLE: slabs mapped meanwhile get 4 KiB
// pages whatever their MADV_HUGEPAGE advice).
func noHugePages(t *testing.T) {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		t.Fatalf("prctl(PR_SET_THP_DISABLE): %v", err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_THP_DISABLE, 0, 0, 0, 0) })
}

// threadFaults is the calling thread's minor page-fault count.
func threadFaults(t *testing.T) int64 {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// ingestFaults stores keys [0, n) in batches of 100, calling between(l)
// after every batch, and returns the minor page faults the Apply calls
// took on this thread, the first batch (which allocates Apply's buffers
// and interns the names) aside. The goroutine stays on its thread and
// the collector is off, so every fault counted is the ledger's own memory
// being touched for the first time inside Apply.
func ingestFaults(t *testing.T, l *Ledger, n int, between func(*Ledger)) (faults int64, growths int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	batch := make([]Event, 100)
	for first := 0; first < n; first += len(batch) {
		for j := range batch {
			batch[j] = Event{Op: OpStore, Key: key(t, fmt.Sprintf("%08x", first+j), "m", "s"), Bytes: 1}
		}
		size := len(l.index)
		before := threadFaults(t)
		l.Apply(batch)
		if first > 0 {
			faults += threadFaults(t) - before
		}
		if len(l.index) != size {
			growths++
		}
		between(l)
	}
	return faults, growths
}

// TestReserveKeepsFaultsOffIngest: with the reserve refilled between
// batches (as the coordinator's loop does between requests), 300,000
// stores across five entry pages and nine index doublings (up to a mapped
// table of 1<<19 slots, the next one prepared) allocate no entry page and
// no index table inside Apply: every one it switches to was allocated and
// written ahead by Refill. The kernel's count agrees: Apply takes no more
// than a stray fault or two on its thread (the runtime's own, such as a
// signal stack; none in most runs), where the same stores without Refill
// fault at least the 1,792 pages of the three mapped tables the ingest
// path then prefaults itself (fresh from the kernel every time; entry
// pages may reuse memory the process already touched), and the reserve
// counts each page and table allocated there. Under the race detector,
// whose shadow memory faults too, only the counters are checked.
// Transparent huge pages are turned off for the process meanwhile, so
// that every fault is one 4 KiB page and the counts above are exact;
// TestSlabsGetHugePages covers slabs with them.
func TestReserveKeepsFaultsOffIngest(t *testing.T) {
	const n = 300_000
	noHugePages(t)
	cold := New()
	faults, growths := ingestFaults(t, cold, n, func(*Ledger) {})
	r := cold.Reserve()
	if r.ColdPages != 5 || r.ColdTables != 9 || growths != 9 || r.PreparedPages+r.PreparedTables != 0 {
		t.Errorf("without Refill: reserve %+v, %d growths; want 5 cold pages, 9 cold tables, 9 growths", r, growths)
	}
	if !raceDetector && faults < 1_792 {
		t.Errorf("without Refill: %d page faults inside Apply, want at least 1,792", faults)
	}

	l := New()
	if p, tb := l.Refill(context.Background()); p != 1 || tb != 0 {
		t.Fatalf("first Refill of an empty ledger prepared %d pages, %d tables; want 1, 0", p, tb)
	}
	faults, growths = ingestFaults(t, l, n, func(l *Ledger) { l.Refill(context.Background()) })
	r = l.Reserve()
	if r.ColdPages != 0 || r.ColdTables != 0 {
		t.Errorf("with the reserve: %d entry pages and %d tables allocated inside Apply; want 0", r.ColdPages, r.ColdTables)
	}
	if !raceDetector && faults > 8 {
		t.Errorf("with the reserve: %d page faults inside Apply, want at most a stray few", faults)
	}
	// 300,000 entries fill 5 pages (65,536 each) and a spare waits; 1024
	// slots doubled to 1<<19 is nine growths, each into a prepared table,
	// and past half of 1<<19 the tenth table is ready too.
	if growths != 9 || len(l.index) != 1<<19 || l.indexSlab == nil || len(l.next) != 1<<20 || l.nextFaulted != 1<<20 ||
		r.PreparedPages != 6 || !r.SparePage || r.PreparedTables != 10 {
		t.Errorf("%d growths to %d slots (mapped %v, next %d slots), reserve %+v; want 9 growths to %d slots, next %d, 6 pages, a spare, 10 tables",
			growths, len(l.index), l.indexSlab != nil, len(l.next), r, 1<<19, 1<<20)
	}
	if st := l.Stats(); st.Keys != n {
		t.Fatalf("%d keys, want %d", st.Keys, n)
	}
}

// TestRefillSkipsWhatIsNotWanted: Refill prepares no table before the
// index is half full nor during a migration, and a table the ingest path
// allocated itself meanwhile makes Refill's own go back.
func TestRefillSkipsWhatIsNotWanted(t *testing.T) {
	l := New()
	store := func(from, to int) {
		for i := from; i < to; i++ {
			l.Store(key(t, fmt.Sprintf("%08x", i), "m", "s"), 1)
		}
	}
	store(0, 512) // exactly half of 1024 slots
	if _, tb := l.Refill(context.Background()); tb != 0 || l.next != nil {
		t.Fatalf("Refill at half full prepared %d tables", tb)
	}
	store(512, 513)
	if _, tb := l.Refill(context.Background()); tb != 1 || len(l.next) != 2048 || l.nextFaulted != 2048 {
		t.Fatalf("Refill past half full prepared %d tables (next %d slots, %d faulted)", tb, len(l.next), l.nextFaulted)
	}
	store(513, 800) // past 3/4: growth into the prepared table, migration running
	if l.old == nil || len(l.index) != 2048 {
		t.Fatalf("no migration running at 800 keys (index %d slots)", len(l.index))
	}
	if l.mu.Lock(); l.wantTable() != 0 {
		t.Fatal("a table is wanted during a migration")
	}
	l.mu.Unlock()
	// The ingest path reaches 5/8 of 2048 before any Refill: it allocates
	// the next table itself, and Refill then has none to give.
	store(800, 1281)
	if r := l.Reserve(); r.ColdTables != 1 || len(l.next) != 4096 {
		t.Fatalf("reserve %+v, next %d slots; want 1 cold table of 4096", r, len(l.next))
	}
	if _, tb := l.Refill(context.Background()); tb != 0 {
		t.Fatalf("Refill prepared %d tables beside the ingest path's own", tb)
	}
}

// TestRefillLoop runs the reserve as the coordinator does, on its own
// goroutine woken by WaitNeed: a store that takes the spare page wakes it
// and a new spare follows; the goroutine stops when its context ends.
func TestRefillLoop(t *testing.T) {
	l := New()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	refilled := make(chan ReserveStats, 8)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			l.WaitNeed(ctx, time.Minute)
			if p, _ := l.Refill(ctx); p > 0 {
				refilled <- l.Reserve()
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	if r := <-refilled; !r.SparePage || r.PreparedPages != 1 {
		t.Fatalf("first refill: %+v", r)
	}
	l.Store(key(t, "00", "m", "s"), 1) // takes the spare for page 0
	if r := <-refilled; !r.SparePage || r.PreparedPages != 2 || r.ColdPages != 0 {
		t.Fatalf("refill after the first page was taken: %+v", r)
	}
}

// TestRefillStopsOnCancel: a Refill whose context has ended stops after
// the first chunk it faults in and hands nothing over, page or table.
func TestRefillStopsOnCancel(t *testing.T) {
	l := New()
	for i := 0; i < 600; i++ { // past half of 1024 slots: a table is wanted
		l.Store(key(t, fmt.Sprintf("%08x", i), "m", "s"), 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if p, tb := l.Refill(ctx); p != 0 || tb != 0 {
		t.Fatalf("cancelled Refill handed over %d pages, %d tables", p, tb)
	}
	// The 5 MiB page is several chunks, so it stopped; the ingest path took
	// its own page for the first store, and no table is ready.
	if r := l.Reserve(); r.SparePage || r.PreparedPages != 0 || r.ColdPages != 1 || l.next != nil {
		t.Fatalf("after a cancelled Refill: reserve %+v, next table %d slots", r, len(l.next))
	}
	// With a live context the same call prepares both.
	if p, tb := l.Refill(context.Background()); p != 1 || tb != 1 {
		t.Fatalf("Refill prepared %d pages, %d tables; want 1, 1", p, tb)
	}
}

// TestRefillYieldsToIngest: while an ingest request is in flight Refill
// faults in nothing and waits, and it goes on as soon as the request is
// done; under a request that never ends every chunk goes ahead after
// refillYield, so an entry page of n chunks takes exactly n waits of
// refillYield and n-1 pauses of refillPause (synctest's clock), each wait
// counted.
func TestRefillYieldsToIngest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New()
		refilled := make(chan int)
		refill := func() {
			go func() {
				pages, _ := l.Refill(t.Context())
				refilled <- pages
			}()
		}
		l.IngestStarted()
		refill()
		synctest.Wait()
		if r := l.Reserve(); r.SparePage || r.YieldWaits != 1 || r.YieldCapped != 0 {
			t.Fatalf("with a request in flight: %+v, want no spare and one wait", r)
		}
		l.IngestDone()
		if pages := <-refilled; pages != 1 {
			t.Fatalf("Refill prepared %d pages after the request, want 1", pages)
		}
		if r := l.Reserve(); !r.SparePage || r.YieldWaits != 1 || r.YieldCapped != 0 {
			t.Fatalf("after the request: %+v", r)
		}

		l.mu.Lock()
		if _, sl := l.newPage(); sl == nil {
			t.Fatal("newPage did not hand over the spare's slab")
		}
		l.mu.Unlock()
		chunks := (len(entryBytes(make([]entry, pageSize))) + refillChunk - 1) / refillChunk
		l.IngestStarted()
		start := time.Now()
		refill()
		if pages := <-refilled; pages != 1 {
			t.Fatalf("Refill under endless ingest prepared %d pages, want 1", pages)
		}
		want := time.Duration(chunks)*refillYield + time.Duration(chunks-1)*refillPause
		if took := time.Since(start); took != want {
			t.Errorf("a %d-chunk page under endless ingest took %v, want %v", chunks, took, want)
		}
		if r := l.Reserve(); !r.SparePage || r.YieldWaits != uint64(1+chunks) || r.YieldCapped != uint64(chunks) {
			t.Errorf("under endless ingest: %+v, want %d waits, %d capped", r, 1+chunks, chunks)
		}

		// Once the page in use is half full the next one is urgent: no
		// waits, only the pauses between chunks.
		l.mu.Lock()
		l.newPage()
		l.n = pageSize + pageSize/2
		l.hint()
		l.mu.Unlock()
		start = time.Now()
		refill()
		if pages := <-refilled; pages != 1 {
			t.Fatalf("urgent Refill prepared %d pages, want 1", pages)
		}
		if took, want := time.Since(start), time.Duration(chunks-1)*refillPause; took != want {
			t.Errorf("an urgent %d-chunk page took %v, want %v", chunks, took, want)
		}
		if r := l.Reserve(); !r.SparePage || r.YieldWaits != uint64(1+chunks) {
			t.Errorf("urgent Refill waited: %+v", r)
		}
		l.IngestDone()
	})
}

// TestRefillTableStopsYieldingHalfWay: Refill preparing the next index
// table yields to ingest until the index is 9/16 full, half way from
// where it starts (1/2) to where the ingest path would allocate the table
// itself (5/8), and then goes ahead without waiting.
func TestRefillTableStopsYieldingHalfWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			live     int
			yielding bool
		}{{1<<17/2 + 1, true}, {1<<17*9/16 + 1, false}} {
			l := New()
			l.index, l.mask, l.live = make([]uint64, 1<<17), 1<<17-1, tc.live
			l.spare, l.spareSlab = newEntryPage()
			l.spareReady.Store(true)
			l.hint()
			l.IngestStarted()
			start := time.Now()
			if pages, tables := l.Refill(t.Context()); pages != 0 || tables != 1 {
				t.Fatalf("live %d: Refill prepared %d pages, %d tables, want the table only", tc.live, pages, tables)
			}
			chunks := 2 << 17 * 8 / refillChunk
			want := time.Duration(chunks-1) * refillPause
			if tc.yielding {
				want += time.Duration(chunks) * refillYield
			}
			if took := time.Since(start); took != want {
				t.Errorf("live %d: the %d-chunk table took %v, want %v", tc.live, chunks, took, want)
			}
			if r := l.Reserve(); r.YieldCapped != map[bool]uint64{true: uint64(chunks)}[tc.yielding] {
				t.Errorf("live %d: %d chunks capped", tc.live, r.YieldCapped)
			}
			l.IngestDone()
		}
	})
}
