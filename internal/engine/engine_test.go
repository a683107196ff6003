package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const objSize = 4096

func mkKey(salt string, chunk, rank, world int) objkey.Key {
	return objkey.Key{ChunkHash: fmt.Sprintf("chunk-%06d", chunk), ModelName: "m", KVRank: objkey.RankFor(world, rank), CacheSalt: salt}
}

// chunks builds lookup chunks [from, to) with every rank of world.
func chunks(salt string, from, to, world int) [][]objkey.Key {
	var out [][]objkey.Key
	for c := from; c < to; c++ {
		var ks []objkey.Key
		for r := range world {
			ks = append(ks, mkKey(salt, c, r, world))
		}
		out = append(out, ks)
	}
	return out
}

func flat(cs [][]objkey.Key) []objkey.Key { return slices.Concat(cs...) }

// pattern is the deterministic content of k's object.
func pattern(k objkey.Key, n int) []byte {
	h := fnv.New64a()
	h.Write([]byte(k.ChunkHash + k.CacheSalt))
	fmt.Fprint(h, k.KVRank)
	x := h.Sum64() | 1
	out := make([]byte, n)
	for i := range out {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out[i] = byte(x)
	}
	return out
}

func payloads(keys []objkey.Key) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = pattern(k, objSize)
	}
	return out
}

type harness struct {
	*Engine
	cancel context.CancelFunc
	done   chan error
}

// start builds and runs an engine; stop() cancels Run, waits and closes.
func start(t *testing.T, cfg Config, adapters ...l2.Adapter) *harness {
	t.Helper()
	if cfg.L1SizeBytes == 0 {
		cfg.L1SizeBytes = 64 * objSize
	}
	e, err := New(cfg, adapters, nil)
	if err != nil {
		t.Fatal(err)
	}
	for w := 1; w <= 4; w++ {
		if err := e.RegisterLayout(Layout{ModelName: "m", WorldSize: w, ObjectBytes: objSize}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{Engine: e, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- e.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !e.Ready() {
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("engine not ready within 30 s")
		}
		time.Sleep(time.Millisecond)
	}
	return h
}

// stop cancels Run, waits for it, fails the test if any read lease, pin or
// staged write is left (naming the keys), and closes the engine.
func (h *harness) stop(t *testing.T) {
	t.Helper()
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Run did not return within 2 minutes of cancel")
	}
	closeChecked(t, h.Engine)
}

// closeChecked closes e (whose Run never started or has returned) and
// fails tb, naming the keys, if any read lease, pin or staged write is left:
// every engine a test builds goes through it, so a reference a code path
// forgets to drop shows in the test that took it.
func closeChecked(tb testing.TB, e *Engine) {
	tb.Helper()
	if err := e.CloseChecked(); err != nil {
		tb.Error(err)
	}
}

func (h *harness) mustPut(t *testing.T, keys []objkey.Key) {
	t.Helper()
	if _, err := h.Put(keys, payloads(keys)); err != nil {
		t.Fatalf("put: %v", err)
	}
}

// mustReadBack is PREPARE_RETRIEVE of read-locked keys, checking that each
// slot holds its key's pattern.
func (h *harness) mustReadBack(t *testing.T, keys []objkey.Key) {
	t.Helper()
	slots, err := h.ReadSlots(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		if !bytes.Equal(h.Bytes(s), pattern(keys[i], objSize)) {
			t.Fatalf("object %d (%v) bytes differ", i, keys[i])
		}
	}
}

func (h *harness) lookup(t *testing.T, id string, cs [][]objkey.Key) PrefetchResult {
	t.Helper()
	if err := h.Prefetch(PrefetchRequest{ID: id, Chunks: cs, Readers: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := h.WaitPrefetch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestStoreLookupRetrieve is the data path: PREPARE_STORE, COMMIT_STORE,
// LOOKUP, PREPARE_RETRIEVE, COMMIT_RETRIEVE.
func TestStoreLookupRetrieve(t *testing.T) {
	h := start(t, Config{ShmName: "t", ShmDir: t.TempDir(), ShmMode: 0o640})
	defer h.stop(t)
	pi := h.Pool()
	if pi.Name != "lmcache_l1_pool_t" || pi.Size != 64*objSize {
		t.Fatalf("pool info %+v", pi)
	}
	if fi, err := os.Stat(pi.Path); err != nil || fi.Mode().Perm() != 0o640 || fi.Size() != pi.Size {
		t.Fatalf("shm file: %v %v", fi, err)
	}
	cs := chunks("", 0, 3, 1)
	keys := flat(cs)
	slots, err := h.ReserveWrite("inst0", keys, []int64{objSize, objSize, objSize})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		if !s.Valid() || s.Offset%4096 != 0 {
			t.Fatalf("slot %d = %+v", i, s)
		}
		copy(h.Bytes(s), pattern(keys[i], objSize))
	}
	// Invisible before commit.
	if r := h.lookup(t, "r0", cs); r.PrefixChunks != 0 {
		t.Fatalf("uncommitted objects visible: %+v", r)
	}
	// A second PREPARE_STORE by the same writer gets no new slots.
	if again, _ := h.ReserveWrite("inst0", keys, []int64{objSize, objSize, objSize}); again[0].Valid() {
		t.Fatal("double reservation")
	}
	if n, err := h.CommitWrite("inst0", keys); n != 3 || err != nil {
		t.Fatalf("commit: %d %v", n, err)
	}
	if again, _ := h.ReserveWrite("inst1", keys[:1], []int64{objSize}); again[0].Valid() {
		t.Fatal("resident key got a write slot")
	}
	r := h.lookup(t, "r1", cs)
	if r.PrefixChunks != 3 || r.L1Keys != 3 || r.TotalKeys != 3 {
		t.Fatalf("lookup: %+v", r)
	}
	if _, err := h.PollPrefetch("r1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second poll: %v", err)
	}
	h.mustReadBack(t, keys)
	if n := h.ReleaseRead("r1", keys, 1); n != 3 {
		t.Fatalf("released %d", n)
	}
	if n := h.ReleaseRead("r1", keys, 1); n != 0 {
		t.Fatalf("over-release: %d", n)
	}
	if _, err := h.ReadSlots(keys); !errors.Is(err, ErrNotReadable) {
		t.Fatalf("retrieve without lock: %v", err)
	}
	got, _ := h.Get(append(keys[:1:1], mkKey("", 99, 0, 1)))
	if !bytes.Equal(got[0], pattern(keys[0], objSize)) || got[1] != nil {
		t.Fatal("Get returned wrong bytes")
	}
	c := h.Counters()
	if c.L1Objects != 3 || c.L1ReadLocked != 0 || c.L1Write[""] != 3 || c.L1Read[""] != 3 {
		t.Fatalf("counters %+v", c)
	}
}

// TestLookupPrefixAllRanks: a chunk counts only when every rank is
// present; locks beyond the prefix are released at once.
func TestLookupPrefixAllRanks(t *testing.T) {
	h := start(t, Config{})
	defer h.stop(t)
	cs := chunks("s", 0, 3, 2)
	h.mustPut(t, append(cs[0], cs[1][0], cs[2][0], cs[2][1]))
	r := h.lookup(t, "req", cs)
	if r.PrefixChunks != 1 || r.L1Keys != 5 {
		t.Fatalf("lookup: %+v", r)
	}
	if c := h.Counters(); c.L1ReadLocked != 2 {
		t.Fatalf("read-locked = %d, want only the prefix's 2 objects", c.L1ReadLocked)
	}
	if _, err := h.ReadSlots(cs[2]); !errors.Is(err, ErrNotReadable) {
		t.Fatalf("beyond-prefix key still locked: %v", err)
	}
	// FREE_LOOKUP_LOCKS for the whole range releases only what was held.
	if n := h.ReleaseRead("req", flat(cs), 1); n != 2 {
		t.Fatalf("released %d, want 2", n)
	}
	if c := h.Counters(); c.PrefetchHitChunksL1 != 1 || c.PrefetchMissChunks != 2 {
		t.Fatalf("prefetch counters %+v", c)
	}
}

// TestAllOrNothingReserve at the engine level: an OOM batch reserves
// nothing and is counted.
func TestAllOrNothingReserve(t *testing.T) {
	h := start(t, Config{L1SizeBytes: 8 * objSize})
	defer h.stop(t)
	keys := flat(chunks("", 0, 9, 1))
	sizes := slices.Repeat([]int64{objSize}, 9)
	if _, err := h.ReserveWrite("w", keys, sizes); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("err = %v", err)
	}
	c := h.Counters()
	if c.L1UsedBytes != 0 || c.L1StagingObjects != 0 || c.L1AllocFailuresStore != 1 {
		t.Fatalf("after OOM: %+v", c)
	}
	if _, err := h.ReserveWrite("w", keys[:8], sizes[:8]); err != nil {
		t.Fatalf("a fitting batch failed: %v", err)
	}
	h.AbortWrite("w", keys[:8])
}

// TestEvictionLRUNeverEvictsLocked: at the watermark the controller evicts
// ratio × tracked keys, least recent first and tail chunks first, and never
// a read-locked object.
func TestEvictionLRUNeverEvictsLocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{EvictionPolicy: PolicyLRU})
		defer h.stop(t)
		old := flat(chunks("", 0, 10, 1)) // one request, oldest
		h.mustPut(t, old)
		newer := flat(chunks("", 10, 60, 1))
		h.mustPut(t, newer)
		// Lock the last 3 chunks of the old request: they would go first.
		if r := h.lookup(t, "hold", [][]objkey.Key{old[7:10]}); r.PrefixChunks != 1 {
			t.Fatalf("lock: %+v", r)
		}
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		c := h.Counters()
		if c.L1EvictionLoopTriggered != 1 || c.L1Evicted[""] != 12 {
			t.Fatalf("evicted %d (triggered %d), want int(60*0.2)=12", c.L1Evicted[""], c.L1EvictionLoopTriggered)
		}
		present := func(ks []objkey.Key) []bool {
			got, _ := h.Get(ks)
			out := make([]bool, len(ks))
			for i, g := range got {
				out[i] = g != nil
			}
			return out
		}
		want := []bool{false, false, false, false, false, false, false, true, true, true}
		if got := present(old); !slices.Equal(got, want) {
			t.Fatalf("old request residency %v, want %v (locked tail kept)", got, want)
		}
		// 12 victims: old[0..6] (7) then the tail of the newer request.
		got := present(newer)
		if slices.Contains(got[:45], false) || slices.Contains(got[45:], true) {
			t.Fatalf("newer request residency %v: want its last 5 chunks evicted", got)
		}
		h.ReleaseRead("hold", old[7:10], 1)
	})
}

// TestIsolatedLRUAllowlist: per-salt budgets; a salt without a quota is
// evicted entirely, salts within quota are untouched, an over-quota salt
// loses ratio of its keys.
func TestIsolatedLRUAllowlist(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{EvictionPolicy: PolicyIsolatedLRU})
		defer h.stop(t)
		h.SetQuota("a", 100*objSize)
		h.SetQuota("", 100*objSize) // the "_default" salt
		h.SetQuota("c", 5*objSize)
		a, b, def, c := flat(chunks("a", 0, 5, 1)), flat(chunks("b", 0, 5, 1)), flat(chunks("", 0, 5, 1)), flat(chunks("c", 0, 10, 1))
		for _, ks := range [][]objkey.Key{a, b, def, c} {
			h.mustPut(t, ks)
		}
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		usage := h.table.UsageBySalt()
		if usage["a"] != 5*objSize || usage[""] != 5*objSize {
			t.Fatalf("salts within quota lost objects: %v", usage)
		}
		if _, ok := usage["b"]; ok {
			t.Fatalf("salt without quota survived: %v", usage)
		}
		if usage["c"] != 8*objSize {
			t.Fatalf("over-quota salt c: %d bytes, want 8 objects (lost 20%%)", usage["c"])
		}
		if cs := h.Counters(); cs.L1Evicted["b"] != 5 || cs.L1Evicted["c"] != 2 || cs.L1Evicted["a"] != 0 {
			t.Fatalf("evicted counters %v", cs.L1Evicted)
		}
	})
}

// TestWriteBehindFailingAdapter: uploads to a failing adapter are retried
// with backoff; the L1 copies stay resident and are not evicted while an
// upload is pending even above the watermark; after recovery every object
// lands byte-identical and the pins are gone.
func TestWriteBehindFailingAdapter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		good, bad := newFake("good"), newFake("bad")
		bad.failing.Store(true)
		h := start(t, Config{StoreMaxAttempts: 100, StoreRetryBase: 100 * time.Millisecond, StoreRetryMax: 2 * time.Second}, good, bad)
		defer h.stop(t)
		keys := flat(chunks("", 0, 60, 1)) // 60/64 > watermark
		h.mustPut(t, keys)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		c := h.Counters()
		if c.L2[1].StoreFailed < 5 || c.L2[1].StoreAbandoned != 0 || c.L2[1].PendingStores != 60 {
			t.Fatalf("bad adapter counters %+v", c.L2[1])
		}
		if c.L2[0].StoreObjects != 60 || c.L2[0].PendingStores != 0 {
			t.Fatalf("good adapter counters %+v", c.L2[0])
		}
		if c.L1Objects != 60 || c.L1PendingUpload != 60 || c.L1EvictionLoopTicks < 9 {
			t.Fatalf("L1 dropped objects with pending uploads: %+v", c)
		}
		bad.failing.Store(false)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		for _, k := range keys {
			b, ok := bad.has(k)
			if !ok || !bytes.Equal(b, pattern(k, objSize)) {
				t.Fatalf("object %v lost or corrupted after recovery", k)
			}
		}
		c = h.Counters()
		if c.L2[1].StoreObjects != 60 || c.L2[1].PendingStores != 0 || c.L1PendingUpload != 0 || c.L2[1].StoreRetried == 0 {
			t.Fatalf("after recovery %+v / %+v", c.L2[1], c)
		}
		// Unpinned now, so eviction can do its job again.
		if c.L1Evicted[""] == 0 {
			t.Fatal("no eviction after the uploads landed")
		}
	})
}

// TestWriteBehindAbandon: after StoreMaxAttempts failures an upload is
// abandoned and counted, and the object becomes evictable.
func TestWriteBehindAbandon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bad := newFake("bad")
		bad.failing.Store(true)
		h := start(t, Config{StoreMaxAttempts: 3, StoreRetryBase: time.Second, EvictionPolicy: PolicyNoop}, bad)
		defer h.stop(t)
		keys := flat(chunks("", 0, 4, 1))
		h.mustPut(t, keys)
		time.Sleep(2 * time.Second) // attempts at 0 s and 1 s
		synctest.Wait()
		if c := h.Counters(); c.L2[0].StoreAbandoned != 0 || c.L1PendingUpload != 4 {
			t.Fatalf("abandoned too early: %+v", c.L2[0])
		}
		time.Sleep(2 * time.Second) // third attempt at 3 s
		synctest.Wait()
		c := h.Counters()
		if c.L2[0].StoreAbandoned != 4 || c.L2[0].StoreFailed != 3 || c.L1PendingUpload != 0 || c.L1Objects != 4 {
			t.Fatalf("after abandon: %+v / pending %d", c.L2[0], c.L1PendingUpload)
		}
		if del, _ := h.DeleteL1(keys, false); del != 4 {
			t.Fatalf("abandoned objects still pinned: deleted %d", del)
		}
	})
}

// TestPrefetchFromL2: misses are loaded from the first adapter holding
// them, locked for the reader, temporary by default, and the L2 locks are
// released.
func TestPrefetchFromL2(t *testing.T) {
	a0, a1 := newFake("a0"), newFake("a1")
	h := start(t, Config{}, a0, a1)
	defer h.stop(t)
	cs := chunks("", 0, 4, 1)
	h.mustPut(t, cs[0])
	a0.put(cs[1][0], pattern(cs[1][0], objSize))
	a1.put(cs[1][0], pattern(cs[1][0], objSize))
	a1.put(cs[2][0], pattern(cs[2][0], objSize))
	r := h.lookup(t, "req", cs)
	if r.PrefixChunks != 3 || r.L1Keys != 1 || r.L2Keys != 2 {
		t.Fatalf("lookup: %+v", r)
	}
	if a0.loadCount(cs[1][0]) != 1 || a1.loadCount(cs[1][0]) != 0 || a1.loadCount(cs[2][0]) != 1 {
		t.Fatal("a key was not served by the first adapter holding it")
	}
	if a0.lockCount() != 0 || a1.lockCount() != 0 {
		t.Fatal("L2 locks leaked")
	}
	h.mustReadBack(t, flat(cs[:3]))
	if c := h.Counters(); c.L1Temporary != 2 || c.PrefetchHitChunksL1 != 1 || c.PrefetchHitChunksL2 != 2 {
		t.Fatalf("counters %+v", c)
	}
	h.ReleaseRead("req", flat(cs), 1)
	got, _ := h.Get(flat(cs[:3]))
	if got[0] == nil || got[1] != nil || got[2] != nil {
		t.Fatal("temporary objects must leave with their last reader; stored ones stay")
	}
	// Loaded objects are never re-stored to L2: once nothing is pending,
	// each adapter holds only the one Put.
	deadline := time.Now().Add(30 * time.Second)
	for c := h.Counters(); c.L2[0].PendingStores+c.L2[1].PendingStores > 0; c = h.Counters() {
		if time.Now().After(deadline) {
			t.Fatal("uploads did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	if c := h.Counters(); c.L2[0].StoreObjects != 1 || c.L2[1].StoreObjects != 1 {
		t.Fatalf("stores %d %d, want only the one Put", c.L2[0].StoreObjects, c.L2[1].StoreObjects)
	}
}

// TestWarmPrefetchExactlyOnce: warm prefetch retains objects unlocked and
// its completion is observed by exactly one of many concurrent pollers.
func TestWarmPrefetchExactlyOnce(t *testing.T) {
	a := newFake("a")
	h := start(t, Config{}, a)
	defer h.stop(t)
	cs := chunks("w", 0, 8, 2)
	for _, k := range flat(cs) {
		a.put(k, pattern(k, objSize))
	}
	for round := range 20 {
		id := fmt.Sprintf("warm-%d", round)
		if round > 0 {
			h.Clear()
		}
		if err := h.Prefetch(PrefetchRequest{ID: id, Chunks: cs, Sparse: true, Retain: true}); err != nil {
			t.Fatal(err)
		}
		results := make(chan PrefetchResult, 8)
		done := make(chan struct{}, 8)
		for range 8 {
			go func() {
				defer func() { done <- struct{}{} }()
				deadline := time.Now().Add(30 * time.Second)
				for time.Now().Before(deadline) {
					r, err := h.PollPrefetch(id)
					if errors.Is(err, ErrNotFound) {
						return
					}
					if r.Done {
						results <- r
						return
					}
					time.Sleep(50 * time.Microsecond)
				}
			}()
		}
		for range 8 {
			<-done
		}
		close(results)
		var got []PrefetchResult
		for r := range results {
			got = append(got, r)
		}
		if len(got) != 1 || got[0].L2Keys != 16 || got[0].TotalKeys != 16 || got[0].PrefixChunks != 8 {
			t.Fatalf("round %d: completions %+v, want exactly one with 16 keys", round, got)
		}
	}
	c := h.Counters()
	if c.L1ReadLocked != 0 || c.L1Temporary != 0 || c.L1Objects != 16 || c.ActivePrefetchJobs != 0 {
		t.Fatalf("warm objects must be resident, unlocked, retained: %+v", c)
	}
}

// TestClearKeepsReaderBytes: CLEAR removes everything, but a reader's
// slot is not reused until it releases.
func TestClearKeepsReaderBytes(t *testing.T) {
	h := start(t, Config{L1SizeBytes: 4 * objSize})
	defer h.stop(t)
	cs := chunks("", 0, 4, 1)
	h.mustPut(t, flat(cs))
	h.lookup(t, "r", cs[:1])
	slots, _ := h.ReadSlots(cs[0])
	if res := h.Clear(); res.Objects != 4 {
		t.Fatalf("clear: %+v", res)
	}
	other := flat(chunks("", 10, 14, 1))
	if _, err := h.Put(other, payloads(other)); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("put into a reader's memory: %v", err)
	}
	h.mustPut(t, other[:3])
	if !bytes.Equal(h.Bytes(slots[0]), pattern(cs[0][0], objSize)) {
		t.Fatal("reader's bytes overwritten after clear")
	}
	h.ReleaseRead("r", cs[0], 1)
	h.mustPut(t, other[3:])
}

// TestFSAdapterRoundTrip uses the real fs adapter: write-behind lands files
// on disk, and after an L1 clear a lookup prefetches them back.
func TestFSAdapterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a, err := openFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	h := start(t, Config{}, a)
	defer h.stop(t)
	cs := chunks("tenant", 0, 6, 2)
	keys := flat(cs)
	h.mustPut(t, keys)
	deadline := time.Now().Add(30 * time.Second)
	for h.Counters().L2[0].StoreObjects < int64(len(keys)) {
		if time.Now().After(deadline) {
			t.Fatalf("uploads did not land: %+v", h.Counters().L2[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, k := range keys {
		b, err := os.ReadFile(filepath.Join(dir, k.FSName()))
		if err != nil || !bytes.Equal(b, pattern(k, objSize)) {
			t.Fatalf("file for %v: %v", k, err)
		}
	}
	h.Clear()
	r := h.lookup(t, "again", cs)
	if r.PrefixChunks != 6 || r.L2Keys != 12 {
		t.Fatalf("lookup after clear: %+v", r)
	}
	h.mustReadBack(t, keys)
	h.ReleaseRead("again", keys, 1)
	if u := h.QuotaUsage()["tenant"]; u != int64(len(keys))*objSize {
		t.Fatalf("quota usage = %d", u)
	}
}

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{},
		{L1SizeBytes: 1 << 20, L1AlignBytes: 1000},
		{L1SizeBytes: 1 << 20, EvictionPolicy: "lru"},
		{L1SizeBytes: 1 << 20, EvictionPolicy: "ARC"},
		{L1SizeBytes: 1 << 20, EvictionRatio: 2},
		{L1SizeBytes: 1 << 20, L2StorePolicy: "sometimes"},
	}
	for i, c := range bad {
		if e, err := New(c, nil, nil); err == nil || !errors.Is(err, ErrInvalid) {
			if e != nil {
				e.Close()
			}
			t.Errorf("config %d accepted: %v", i, err)
		}
	}
	e, err := New(Config{L1SizeBytes: 1 << 20}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeChecked(t, e)
	if _, err := e.Layout("x", 1); !errors.Is(err, ErrNoLayout) {
		t.Fatalf("missing layout: %v", err)
	}
	if err := e.RegisterLayout(Layout{ModelName: "x", WorldSize: 2, ObjectBytes: 10, GroupObjectBytes: []int64{0, 20}}); err != nil {
		t.Fatal(err)
	}
	if l, err := e.Layout("x", 2); err != nil || l.SizeOf(0) != 10 || l.SizeOf(1) != 20 || l.SizeOf(7) != 10 {
		t.Fatalf("layout %+v %v", l, err)
	}
	if ls := e.Layouts(); len(ls) != 1 || ls[0].ModelName != "x" || ls[0].WorldSize != 2 {
		t.Fatalf("layouts %+v", ls)
	}
	if !e.UnregisterLayout("x", 2) || e.UnregisterLayout("x", 2) || len(e.Layouts()) != 0 {
		t.Fatal("unregister")
	}
	if _, err := e.Layout("x", 2); !errors.Is(err, ErrNoLayout) {
		t.Fatalf("unregistered layout still found: %v", err)
	}
	if err := e.SetQuota("x", -1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative quota: %v", err)
	}
	if _, exists := e.Quota("x"); exists {
		t.Fatal("a rejected quota was registered")
	}
	if _, err := e.ListL2(context.Background(), 0, "", 10, ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bad adapter index: %v", err)
	}
}

// TestCloseRefusedUntilRunReturns: after Run's context is cancelled Run
// still waits for an upload in flight, which reads pool memory; Close must
// not unmap the pool until Run has returned.
func TestCloseRefusedUntilRunReturns(t *testing.T) {
	a := newFake("stuck")
	a.storeGate = make(chan struct{})
	h := start(t, Config{}, a)
	keys := flat(chunks("", 0, 1, 1))
	h.mustPut(t, keys)
	waitFor(t, func() bool { return h.Counters().L2[0].InflightStores == 1 })
	if sc := h.Status()["store_controller"].(map[string]any); sc["in_flight_task_count"] != int64(1) || sc["pending_keys_count"] != 0 {
		t.Fatalf("store_controller with one upload stuck: %v", sc)
	}
	h.cancel()
	waitFor(t, func() bool { return !h.Ready() })
	if err := h.Close(); err == nil {
		t.Fatal("Close unmapped the pool while Run was still waiting for an upload")
	}
	close(a.storeGate)
	if err := <-h.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if b, ok := a.has(keys[0]); !ok || !bytes.Equal(b, pattern(keys[0], objSize)) {
		t.Fatal("the upload in flight at shutdown did not complete intact")
	}
	// Close now succeeds, and nothing is left referenced.
	closeChecked(t, h.Engine)
}

// TestStoreMakesRoomBelowWatermark: a store that does not fit while usage
// is below the eviction watermark (so no tick would ever evict) evicts just
// enough least-recent unlocked objects and succeeds; when the unlocked
// objects cannot free enough, or under the noop policy, nothing is evicted
// and the store fails as a whole.
func TestStoreMakesRoomBelowWatermark(t *testing.T) {
	h := start(t, Config{L1SizeBytes: 10 * objSize})
	defer h.stop(t)
	old := flat(chunks("", 0, 7, 1)) // 70 %: below the 0.8 watermark
	for _, k := range old {
		h.mustPut(t, []objkey.Key{k}) // one request each: old[0] is the least recent
	}
	h.lookup(t, "hold", [][]objkey.Key{old[:1]}) // old[0] is read-locked
	batch := flat(chunks("", 10, 14, 1))         // needs 4 slots, 3 are free
	sizes := slices.Repeat([]int64{objSize}, 4)
	slots, err := h.ReserveWrite("w", batch, sizes)
	if err != nil {
		t.Fatalf("store below the watermark: %v", err)
	}
	for i, s := range slots {
		copy(h.Bytes(s), pattern(batch[i], objSize))
	}
	if n, err := h.CommitWrite("w", batch); n != 4 || err != nil {
		t.Fatalf("commit: %d %v", n, err)
	}
	got, _ := h.Get(old)
	for i, b := range got {
		if (b == nil) != (i == 1) {
			t.Fatalf("old[%d] resident=%v; want exactly old[1] evicted (the least recent unlocked object)", i, b != nil)
		}
	}
	if c := h.Counters(); c.L1Evicted[""] != 1 || c.L1AllocFailuresStore != 0 {
		t.Fatalf("counters %+v", c)
	}

	// Lock everything: nothing may go, so nothing goes.
	resident := append(append([]objkey.Key{old[0]}, old[2:]...), batch...)
	h.lookup(t, "all", [][]objkey.Key{resident})
	more := flat(chunks("", 20, 22, 1))
	if _, err := h.ReserveWrite("w", more, sizes[:2]); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("store with every object locked: %v", err)
	}
	if c := h.Counters(); c.L1Objects != 10 || c.L1Evicted[""] != 1 || c.L1AllocFailuresStore != 1 {
		t.Fatalf("after the refused store: %+v", c)
	}
	h.ReleaseRead("hold", old[:1], 1)
	h.ReleaseRead("all", resident, 1)

	noop := start(t, Config{L1SizeBytes: 4 * objSize, EvictionPolicy: PolicyNoop})
	defer noop.stop(t)
	noop.mustPut(t, old[:3])
	if _, err := noop.ReserveWrite("w", batch[:2], sizes[:2]); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("noop policy evicted to make room: %v", err)
	}
	if c := noop.Counters(); c.L1Objects != 3 {
		t.Fatalf("noop engine lost objects: %+v", c)
	}
}
