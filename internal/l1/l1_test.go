package l1

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const kib = 1024

func key(i int) objkey.Key {
	return objkey.Key{ChunkHash: fmt.Sprintf("chunk-%04d", i), ModelName: "m", KVRank: objkey.RankFor(1, 0)}
}

func keyRange(from, to int) []objkey.Key {
	var out []objkey.Key
	for i := from; i < to; i++ {
		out = append(out, key(i))
	}
	return out
}

func saltedRange(salt string, from, to int) []objkey.Key {
	ks := keyRange(from, to)
	for i := range ks {
		ks[i].CacheSalt = salt
	}
	return ks
}

func sizes(n int, s int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func newTable(size int64, policy string) *Table {
	t, err := NewTable(TableConfig{Size: size, Align: 4 * kib, ReadTTL: 300 * time.Second, WriteTTL: 600 * time.Second, Policy: policy})
	if err != nil {
		panic(err)
	}
	return t
}

var evictAll = []Cut{{Global: true, Ratio: 1}}

// store reserves and commits keys for tag "w" with 4 KiB objects.
func store(t *testing.T, tb *Table, keys []objkey.Key) {
	t.Helper()
	if _, err := tb.Reserve("w", keys, sizes(len(keys), 4*kib)); err != nil {
		t.Fatalf("reserve: %v", err)
	}
	if res := tb.Commit("w", keys, CommitOpts{}); res.Committed != len(keys) {
		t.Fatalf("committed %d of %d", res.Committed, len(keys))
	}
}

func TestNormalizeShmName(t *testing.T) {
	for in, want := range map[string]string{"": "", "/": "", "a": "lmcache_l1_pool_a", "/a": "lmcache_l1_pool_a", "lmcache_l1_pool_x": "lmcache_l1_pool_x"} {
		if got := NormalizeShmName(in); got != want {
			t.Errorf("NormalizeShmName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestShmPool: the pool file is created sized with the requested mode,
// replaces a stale file, is shared with another mapping of the same file,
// and is unlinked on Close.
func TestShmPool(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "lmcache_l1_pool_t1")
	if err := os.WriteFile(stale, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(PoolConfig{Size: 1<<20 + 1, ShmName: "/t1", ShmDir: dir, ShmMode: 0o660})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "lmcache_l1_pool_t1" || p.Path() != stale {
		t.Fatalf("name %q path %q", p.Name(), p.Path())
	}
	if p.Size() != 1<<20+4096 {
		t.Fatalf("size = %d, want rounded to alignment", p.Size())
	}
	fi, err := os.Stat(stale)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != p.Size() || fi.Mode().Perm() != 0o660 {
		t.Fatalf("file size %d mode %v", fi.Size(), fi.Mode().Perm())
	}
	copy(p.Bytes(8192, 5), "hello")
	// A second process (the vLLM worker) sees the bytes through the file.
	got := make([]byte, 5)
	f, err := os.Open(stale)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(got, 8192); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if string(got) != "hello" {
		t.Fatalf("shared bytes = %q", got)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("shm file survives Close: %v", err)
	}
}

func TestPoolRejectsBadAlign(t *testing.T) {
	if _, err := NewPool(PoolConfig{Size: 1 << 20, Align: 3000}); err == nil {
		t.Fatal("align 3000 accepted")
	}
}

// TestAllocBatchAllOrNothing: a batch that does not fit allocates nothing,
// extents are aligned and coalesce back into one.
func TestAllocBatchAllOrNothing(t *testing.T) {
	a := NewAllocator(64*kib, 4*kib)
	offs, ok := a.AllocBatch([]int64{1, 4 * kib, 4*kib + 1})
	if !ok {
		t.Fatal("first batch failed")
	}
	for _, o := range offs {
		if o%(4*kib) != 0 {
			t.Fatalf("offset %d not aligned", o)
		}
	}
	if a.Used() != 16*kib {
		t.Fatalf("used = %d, want 16 KiB (1 + 1 + 2 pages)", a.Used())
	}
	// 48 KiB remain; a batch needing 52 KiB must leave no trace.
	if _, ok := a.AllocBatch(sizes(13, 4*kib)); ok {
		t.Fatal("oversized batch succeeded")
	}
	if a.Used() != 16*kib {
		t.Fatalf("used after failed batch = %d", a.Used())
	}
	// Fragment, then fail in the middle of a batch (52 KiB free in total,
	// but after the 8 KiB object only 40 KiB are contiguous): still
	// all-or-nothing.
	a.Free(offs[1], 4*kib)
	if _, ok := a.AllocBatch([]int64{8 * kib, 44 * kib}); ok {
		t.Fatal("batch with unfittable object succeeded")
	}
	if a.Used() != 12*kib {
		t.Fatalf("used after failed fragmented batch = %d, want 12 KiB", a.Used())
	}
	a.Free(offs[0], 1)
	a.Free(offs[2], 4*kib+1)
	if a.Used() != 0 || a.FreeExtents() != 1 {
		t.Fatalf("after freeing all: used=%d extents=%d", a.Used(), a.FreeExtents())
	}
	if _, ok := a.Alloc(64 * kib); !ok {
		t.Fatal("whole region not allocatable after coalescing")
	}
}

// TestReserveAllOrNothing: a batch reservation that does not fit stages
// nothing; keys already resident get no slot.
func TestReserveAllOrNothing(t *testing.T) {
	tb := newTable(40*kib, "")
	store(t, tb, keyRange(0, 2))
	_, err := tb.Reserve("w", keyRange(0, 12), sizes(12, 4*kib))
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("err = %v, want ErrOutOfMemory", err)
	}
	st := tb.Stats()
	if st.StagingObjects != 0 || st.UsedBytes != 8*kib {
		t.Fatalf("after failed batch: staging=%d used=%d", st.StagingObjects, st.UsedBytes)
	}
	slots, err := tb.Reserve("w", keyRange(0, 10), sizes(10, 4*kib))
	if err != nil {
		t.Fatal(err)
	}
	if slots[0].Size != 0 || slots[1].Size != 0 || slots[2].Size != 4*kib {
		t.Fatalf("slots = %v; resident keys must get none", slots[:3])
	}
	if tb.Stats().UsedBytes != 40*kib {
		t.Fatalf("used = %d", tb.Stats().UsedBytes)
	}
}

// TestStagingInvisible: writers stage privately; readers see nothing until
// commit, and another tag may stage the same key concurrently.
func TestStagingInvisible(t *testing.T) {
	tb := newTable(64*kib, "")
	k := keyRange(0, 1)
	a, _ := tb.Reserve("a", k, sizes(1, kib))
	b, _ := tb.Reserve("b", k, sizes(1, kib))
	if a[0].Size == 0 || b[0].Size == 0 || a[0].Offset == b[0].Offset {
		t.Fatalf("two writers must get two private buffers: %v %v", a, b)
	}
	if again, _ := tb.Reserve("a", k, sizes(1, kib)); again[0].Size != 0 {
		t.Fatal("same tag got a second live reservation")
	}
	if tb.ReadLock("r", k, 1)[0].Size != 0 || tb.Contains(k)[0] {
		t.Fatal("staged object visible to readers")
	}
	if res := tb.Commit("a", k, CommitOpts{}); res.Committed != 1 || len(res.Published) != 1 {
		t.Fatalf("commit a: %+v", res)
	}
	// b commits after a: its copy is dropped, the key still counts.
	if res := tb.Commit("b", k, CommitOpts{}); res.Committed != 1 || len(res.Published) != 0 {
		t.Fatalf("commit b: %+v", res)
	}
	if got := tb.ReadLock("r", k, 1)[0]; got != a[0] {
		t.Fatalf("reader sees %v, want a's buffer %v", got, a[0])
	}
	if res := tb.Commit("c", k, CommitOpts{}); res.Missing != 1 {
		t.Fatalf("commit without reservation: %+v", res)
	}
	if st := tb.Stats(); st.UsedBytes != 4*kib || st.StagingObjects != 0 {
		t.Fatalf("b's staging copy leaked: %+v", st)
	}
}

// TestReadLeaseExpiry: a reader that never releases (a crashed client)
// stops protecting the object after the read TTL; its late release cannot
// drop a newer reader's lock.
func TestReadLeaseExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newTable(64*kib, eviction.LRUName)
		k := keyRange(0, 1)
		store(t, tb, k)
		tb.ReadLock("crashed", k, 1)
		time.Sleep(299 * time.Second)
		if ev, _ := tb.Evict(evictAll); len(ev) != 0 {
			t.Fatal("read-locked object evicted before its lease ended")
		}
		time.Sleep(2 * time.Second)
		if st := tb.Stats(); st.ReadLocked != 0 {
			t.Fatalf("lease did not expire: %+v", st)
		}
		tb.ReadLock("live", k, 1)
		if n, _ := tb.Release("crashed", k, 1); n != 0 {
			t.Fatalf("stale owner released %d locks", n)
		}
		if ev, _ := tb.Evict(evictAll); len(ev) != 0 {
			t.Fatal("object evicted while the live reader holds it")
		}
		if n, _ := tb.Release("live", k, 1); n != 1 {
			t.Fatalf("live owner released %d, want 1", n)
		}
		if ev, _ := tb.Evict(evictAll); len(ev) != 1 {
			t.Fatal("unlocked object not evictable")
		}
		if tb.Stats().ExpiredReads != 1 {
			t.Fatalf("expired reads = %d", tb.Stats().ExpiredReads)
		}
	})
}

// TestWriteLeaseExpiry: an abandoned reservation is reclaimed after the
// write TTL; a commit after expiry is refused; the same tag may take over
// an expired reservation.
func TestWriteLeaseExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newTable(16*kib, "")
		k := keyRange(0, 4)
		if _, err := tb.Reserve("w", k, sizes(4, 4*kib)); err != nil {
			t.Fatal(err)
		}
		if _, err := tb.Reserve("x", keyRange(10, 11), sizes(1, 4*kib)); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("pool should be full: %v", err)
		}
		time.Sleep(601 * time.Second)
		if res := tb.Commit("w", k[:1], CommitOpts{}); res.Expired != 1 || res.Committed != 0 {
			t.Fatalf("late commit: %+v", res)
		}
		// Same tag, expired lease: the old buffer is handed over.
		slots, err := tb.Reserve("w", k[1:2], sizes(1, 4*kib))
		if err != nil || slots[0].Size == 0 {
			t.Fatalf("takeover: %v %v", slots, err)
		}
		tb.Sweep()
		st := tb.Stats()
		if st.StagingObjects != 1 || st.UsedBytes != 4*kib {
			t.Fatalf("after sweep: %+v", st)
		}
		if res := tb.Commit("w", k[1:2], CommitOpts{}); res.Committed != 1 {
			t.Fatalf("commit after takeover: %+v", res)
		}
	})
}

// TestNoFreeWhileReader: deleting or clearing a read-locked object detaches
// it; its memory is not handed to anyone until the reader releases.
func TestNoFreeWhileReader(t *testing.T) {
	tb := newTable(16*kib, eviction.LRUName)
	k := keyRange(0, 4)
	store(t, tb, k)
	locked := tb.ReadLock("r", k[:1], 1)[0]
	if del, skipped := tb.Delete(k, false); len(del) != 3 || skipped != 1 {
		t.Fatalf("delete = %d deleted, %d skipped", len(del), skipped)
	}
	if del, _ := tb.Delete(k[:1], true); len(del) != 1 {
		t.Fatal("force delete failed")
	}
	slots, err := tb.Reserve("w", keyRange(10, 14), sizes(4, 4*kib))
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("reserve over a detached object's memory: %v %v", slots, err)
	}
	slots, err = tb.Reserve("w", keyRange(10, 13), sizes(3, 4*kib))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.Offset == locked.Offset {
			t.Fatal("reader's memory handed to a writer")
		}
	}
	if n, _ := tb.Release("r", k[:1], 1); n != 1 {
		t.Fatal("release of detached object failed")
	}
	if tb.Stats().Detached != 0 || tb.Stats().UsedBytes != 12*kib {
		t.Fatalf("detached object not freed: %+v", tb.Stats())
	}
	// Clear behaves the same.
	tb.Commit("w", keyRange(10, 13), CommitOpts{})
	tb.ReadLock("r2", keyRange(10, 11), 1)
	keys, _ := tb.Clear()
	if len(keys) != 3 || tb.Stats().UsedBytes != 4*kib {
		t.Fatalf("clear: %d keys, used %d", len(keys), tb.Stats().UsedBytes)
	}
	tb.Release("r2", keyRange(10, 11), 1)
	if tb.Stats().UsedBytes != 0 {
		t.Fatalf("used after last release = %d", tb.Stats().UsedBytes)
	}
}

// TestTemporaryFreedOnLastRelease and owner accounting.
func TestTemporaryFreedOnLastRelease(t *testing.T) {
	tb := newTable(16*kib, eviction.LRUName)
	k := keyRange(0, 1)
	tb.Reserve("p", k, sizes(1, 4*kib))
	res := tb.Commit("p", k, CommitOpts{Temporary: true, Readers: 2, Owner: "req"})
	if len(res.Locked) != 1 {
		t.Fatalf("commit: %+v", res)
	}
	if n, del := tb.Release("req", k, 1); n != 1 || len(del) != 0 {
		t.Fatalf("first release: %d %v", n, del)
	}
	if n, del := tb.Release("req", k, 5); n != 1 || !slices.Equal(del, k) {
		t.Fatalf("second release: %d %v (over-release must be clamped)", n, del)
	}
	if n, _ := tb.Release("req", k, 1); n != 0 {
		t.Fatal("released more than owned")
	}
	if tb.Contains(k)[0] || tb.Stats().UsedBytes != 0 {
		t.Fatal("temporary object survived its last reader")
	}
}

// TestPinnedNotEvicted: an object with a pending upload is not evictable
// until unpinned.
func TestPinnedNotEvicted(t *testing.T) {
	tb := newTable(16*kib, eviction.LRUName)
	k := keyRange(0, 2)
	tb.Reserve("w", k, sizes(2, 4*kib))
	res := tb.Commit("w", k, CommitOpts{Pins: 1})
	if ev, _ := tb.Evict(evictAll); len(ev) != 0 {
		t.Fatalf("evicted pinned objects %v", ev)
	}
	tb.Unpin(res.Published[0])
	if ev, _ := tb.Evict(evictAll); len(ev) != 1 || ev[0] != res.Published[0].Key() {
		t.Fatalf("evicted %v, want only the unpinned one", ev)
	}
}

func TestSlotsRequireReadLock(t *testing.T) {
	tb := newTable(16*kib, "")
	store(t, tb, keyRange(0, 2))
	if _, err := tb.Slots(keyRange(0, 2)); !errors.Is(err, ErrNotReadable) {
		t.Fatalf("unlocked slots: %v", err)
	}
	if _, err := tb.Slots(keyRange(2, 3)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	tb.ReadLock("", keyRange(0, 2), 1)
	if s, err := tb.Slots(keyRange(0, 2)); err != nil || s[1].Size != 4*kib {
		t.Fatalf("slots: %v %v", s, err)
	}
}

// TestEvictOrder: tail-first within a batch, per-salt lists under
// IsolatedLRU, Touch refreshes, locked objects skipped and not counted.
func TestEvictOrder(t *testing.T) {
	tb := newTable(64*kib, eviction.IsolatedLRUName)
	a, b := saltedRange("a", 0, 4), saltedRange("b", 0, 4)
	store(t, tb, append(a[:2:2], b[:2]...)) // mixed batch
	store(t, tb, a[2:])
	store(t, tb, b[2:])
	tb.Touch(a[:1])
	tb.ReadLock("r", a[1:2], 1)
	ev, _ := tb.Evict([]Cut{{Salt: "a", Ratio: 0.5}})
	// a's order: a1, a3, a2, a0 (a0 touched); a1 is locked → a3, a2.
	if want := []objkey.Key{a[3], a[2]}; !slices.Equal(ev, want) {
		t.Fatalf("evicted %v, want %v", ev, want)
	}
	if tb.Stats().Objects != 6 {
		t.Fatalf("salt cut touched other salts: %+v", tb.Stats())
	}
	ev, _ = tb.Evict([]Cut{{Global: true, Ratio: 1}})
	if len(ev) != 5 || slices.Contains(ev, a[1]) {
		t.Fatalf("global cut evicted %v", ev)
	}
	lru := newTable(64*kib, eviction.LRUName)
	store(t, lru, keyRange(0, 4))
	if ev, _ := lru.Evict([]Cut{{Global: true, Ratio: 0.5}}); !slices.Equal(ev, []objkey.Key{key(3), key(2)}) {
		t.Fatalf("LRU tail-first: %v", ev)
	}
	if ev, _ := lru.Evict([]Cut{{Salt: "", Ratio: 1}}); len(ev) != 0 {
		t.Fatalf("salt cut on LRU evicted %v", ev)
	}
	if _, err := NewTable(TableConfig{Size: kib, Align: kib, Policy: "ARC"}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

// TestHugePagesPool: --l1-use-hugepages is refused with SHM and when too
// few huge pages are reserved; with enough it maps hugetlb memory.
func TestHugePagesPool(t *testing.T) {
	if _, err := NewPool(PoolConfig{Size: 4 << 20, HugePages: true, ShmName: "x", ShmDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), `--shm-name ""`) {
		t.Fatalf("hugepages with shm: %v", err)
	}
	dir := t.TempDir()
	old := freeHugePagesFile
	defer func() { freeHugePagesFile = old }()
	freeHugePagesFile = filepath.Join(dir, "free")
	os.WriteFile(freeHugePagesFile, []byte("1\n"), 0o644)
	if _, err := NewPool(PoolConfig{Size: 4<<20 + 1, HugePages: true}); err == nil || !strings.Contains(err.Error(), "1 free 2 MiB huge pages, need 3") {
		t.Fatalf("too few huge pages: %v", err)
	}
	freeHugePagesFile = old
	free, err := freeHugePages()
	if err != nil || free < 2 {
		t.Skipf("host has %d free huge pages (%v); mapping not exercised", free, err)
	}
	p, err := NewPool(PoolConfig{Size: 4 << 20, HugePages: true})
	if err != nil {
		t.Fatal(err)
	}
	copy(p.Bytes(0, 5), "hello")
	if p.Size() != 4<<20 {
		t.Fatalf("size %d", p.Size())
	}
	p.Close()
}

// TestAllocCrowdedClass: many free extents one page too small for a request
// of their class do not stop it from being served from a larger extent, and
// every extent stays disjoint.
func TestAllocCrowdedClass(t *testing.T) {
	const page = 4 * kib
	a := NewAllocator(4096*page, page)
	// Carve 200 holes of 4 pages (class 2) separated by 1 used page.
	var holes []int64
	for range 200 {
		off, _ := a.Alloc(4 * page)
		holes = append(holes, off)
		a.Alloc(page)
	}
	for _, h := range holes {
		a.Free(h, 4*page)
	}
	// 5 pages is class 2 as well, but fits none of the holes.
	seen := map[int64]bool{}
	for range 100 {
		off, ok := a.Alloc(5 * page)
		if !ok {
			t.Fatal("allocation failed with plenty of free space")
		}
		for _, h := range holes {
			if off >= h && off < h+4*page {
				t.Fatalf("5-page object placed in a 4-page hole at %d", h)
			}
		}
		if seen[off] {
			t.Fatalf("offset %d handed out twice", off)
		}
		seen[off] = true
	}
	// A 4-page request still finds a hole.
	if off, ok := a.Alloc(4 * page); !ok || !slices.Contains(holes, off) {
		t.Fatalf("4-page request got %d %v, want a hole", off, ok)
	}
}

// TestMakeRoom: just enough room for the keys that are not resident,
// least recent first, salts in turn under IsolatedLRU, locked objects and
// the batch's own resident keys skipped; all or nothing.
func TestMakeRoom(t *testing.T) {
	tb := newTable(32*kib, eviction.IsolatedLRUName) // 8 slots
	a, b := saltedRange("a", 0, 3), saltedRange("b", 0, 3)
	for _, k := range append(slices.Clone(a), b...) {
		store(t, tb, []objkey.Key{k}) // one batch each: index 0 is the least recent
	}
	tb.ReadLock("r", a[:1], 1)
	// 2 slots free; 5 keys of which one is resident: 4 needed, 2 short.
	want := append(slices.Clone(b[:1]), keyRange(100, 104)...)
	if ev, n := tb.MakeRoom("w", want, sizes(len(want), 4*kib)); !slices.Equal(ev, []objkey.Key{a[1], b[1]}) || n != 8*kib {
		t.Fatalf("evicted %v (%d bytes), want a1 (a0 is locked) and b1 (b0 is in the batch), one per salt", ev, n)
	}
	if _, err := tb.Reserve("w", want, sizes(len(want), 4*kib)); err != nil {
		t.Fatalf("reserve after MakeRoom: %v", err)
	}
	// Pool full (4 resident, 4 staging); only a2, b0 and b2 are evictable
	// (a0 is locked), so asking for 4 slots evicts nothing at all.
	if ev, _ := tb.MakeRoom("w", keyRange(200, 204), sizes(4, 4*kib)); len(ev) != 0 {
		t.Fatalf("evicted %v for a batch that cannot fit", ev)
	}
	if st := tb.Stats(); st.Objects != 4 || st.StagingObjects != 4 {
		t.Fatalf("objects = %d (staging %d), want 4 resident untouched", st.Objects, st.StagingObjects)
	}
	// Enough room already: nothing is evicted.
	tb.Abort("w", want)
	if ev, _ := tb.MakeRoom("w", keyRange(300, 301), sizes(1, 4*kib)); len(ev) != 0 {
		t.Fatalf("evicted %v with room to spare", ev)
	}
}

// scanStats is what Stats would count by visiting every resident object;
// tests check the incremental counts against it.
func (t *Table) scanStats() (readLocked, pinned int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := now()
	for _, o := range t.resident {
		if o.readers > 0 && now <= o.readExp {
			readLocked++
		}
		if o.pins > 0 {
			pinned++
		}
	}
	return readLocked, pinned
}

// TestStatsCountsMatchScan: after every step of a random mix of stores,
// locks, releases, unpins, deletes, clears, evictions and lease expiries,
// the incrementally kept ReadLocked and Pinned equal a full scan.
func TestStatsCountsMatchScan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newTable(64*kib, eviction.LRUName)
		r := rand.New(rand.NewPCG(1, 2))
		var handles []Handle
		for step := range 3000 {
			from := r.IntN(20)
			ks := keyRange(from, from+1+r.IntN(3))
			switch op := r.IntN(10); op {
			case 0, 1:
				if _, err := tb.Reserve("w", ks, sizes(len(ks), 4*kib)); err == nil {
					res := tb.Commit("w", ks, CommitOpts{Pins: r.IntN(3), Readers: r.IntN(2), Owner: "c", Temporary: r.IntN(4) == 0})
					handles = append(handles, res.Published...)
				}
			case 2, 3:
				tb.ReadLock(fmt.Sprint("o", r.IntN(3)), ks, 1+r.IntN(2))
			case 4:
				tb.Release(fmt.Sprint("o", r.IntN(3)), ks, 1+r.IntN(2))
			case 5:
				if len(handles) > 0 {
					i := r.IntN(len(handles))
					tb.Unpin(handles[i])
					handles = append(handles[:i], handles[i+1:]...)
				}
			case 6:
				tb.Delete(ks, r.IntN(2) == 0)
			case 7:
				tb.Evict([]Cut{{Global: true, Ratio: 0.3}})
			case 8:
				time.Sleep(time.Duration(r.IntN(200)) * time.Second) // leases run out
				tb.Sweep()
			case 9:
				if r.IntN(20) == 0 {
					tb.Clear()
				}
			}
			st := tb.Stats()
			if rl, pn := tb.scanStats(); st.ReadLocked != rl || st.Pinned != pn {
				t.Fatalf("step %d: Stats ReadLocked=%d Pinned=%d, scan %d %d", step, st.ReadLocked, st.Pinned, rl, pn)
			}
		}
	})
}

// TestLeaksNameEveryReference: a live read lease (with its holder), a pin
// and a staged write each show up in Leaks naming the key; once released,
// unpinned and aborted nothing is left, and a force-deleted object still
// read-locked is reported as detached.
func TestLeaksNameEveryReference(t *testing.T) {
	tb := newTable(64*kib, "LRU")
	store(t, tb, keyRange(0, 2))
	tb.ReadLock("req-1", keyRange(0, 1), 1)
	if _, err := tb.Reserve("writer", keyRange(5, 6), sizes(1, 4*kib)); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Reserve("p", keyRange(7, 8), sizes(1, 4*kib)); err != nil {
		t.Fatal(err)
	}
	pinned := tb.Commit("p", keyRange(7, 8), CommitOpts{Pins: 1}).Published[0]
	want := []string{
		fmt.Sprintf("pin (resident) %s: 1 pending uploads", key(7)),
		fmt.Sprintf("read lease (resident) %s: 1 readers, holders [{req-1 1}]", key(0)),
		fmt.Sprintf("staged write %s by \"writer\"", key(5)),
	}
	if got := tb.Leaks(); !slices.Equal(got, want) {
		t.Fatalf("Leaks() = %q\nwant %q", got, want)
	}
	tb.Delete(keyRange(0, 1), true)
	if got := tb.Leaks(); len(got) != 3 || got[1] != fmt.Sprintf("read lease (detached) %s: 1 readers, holders [{req-1 1}]", key(0)) {
		t.Fatalf("after a forced delete: %q", got)
	}
	tb.Release("req-1", keyRange(0, 1), 1)
	tb.Unpin(pinned)
	tb.Abort("writer", keyRange(5, 6))
	if got := tb.Leaks(); len(got) != 0 {
		t.Fatalf("after releasing everything: %q", got)
	}
}
