package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fault"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/polltest"
)

// TestStorePolicySkipL1: once every adapter holds an object, its L1 copy is
// dropped; an object whose upload was abandoned stays.
func TestStorePolicySkipL1(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newFake("a"), newFake("b")
		h := start(t, Config{L2StorePolicy: StorePolicySkipL1, StoreMaxAttempts: 2}, a, b)
		defer h.stop(t)
		keys := flat(chunks("", 0, 4, 1))
		h.mustPut(t, keys[:2])
		time.Sleep(time.Second)
		synctest.Wait()
		if got, _ := h.Get(keys[:2]); got[0] != nil || got[1] != nil {
			t.Fatal("skip_l1 kept the L1 copy after both uploads landed")
		}
		if _, ok := b.has(keys[0]); !ok {
			t.Fatal("object missing in L2")
		}
		b.failing.Store(true)
		h.mustPut(t, keys[2:])
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got, _ := h.Get(keys[2:]); got[0] == nil || got[1] == nil {
			t.Fatal("skip_l1 dropped an object one adapter never received")
		}
		if c := h.Counters(); c.L2[1].StoreAbandoned != 2 {
			t.Fatalf("abandoned = %d", c.L2[1].StoreAbandoned)
		}
	})
}

// TestPrefetchRetainPolicy: with --l2-prefetch-policy retain, loaded
// objects stay resident after the last reader leaves.
func TestPrefetchRetainPolicy(t *testing.T) {
	a := newFake("a")
	h := start(t, Config{L2PrefetchPolicy: PrefetchPolicyRetain}, a)
	defer h.stop(t)
	cs := chunks("", 0, 2, 1)
	for _, k := range flat(cs) {
		a.put(k, pattern(k, objSize))
	}
	if r := h.lookup(t, "req", cs); r.PrefixChunks != 2 || r.L2Keys != 2 {
		t.Fatalf("lookup %+v", r)
	}
	h.ReleaseRead("req", flat(cs), 1)
	if c := h.Counters(); c.L1Objects != 2 || c.L1Temporary != 0 {
		t.Fatalf("retain policy: %+v", c)
	}
}

// TestPrefetchMaxInFlightAndTimeout: no more than
// --l2-prefetch-max-in-flight jobs touch L2 at once, and
// --l2-prefetch-load-timeout ends a stuck load (the job completes with an
// error and L1 keeps no staging buffer).
func TestPrefetchMaxInFlightAndTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newFake("slow")
		a.gate = make(chan struct{})
		h := start(t, Config{L2PrefetchMaxInFlight: 2, L2PrefetchLoadTimeout: 10 * time.Second}, a)
		defer h.stop(t)
		for i := range 5 {
			cs := chunks("", i, i+1, 1)
			a.put(cs[0][0], pattern(cs[0][0], objSize))
			if err := h.Prefetch(PrefetchRequest{ID: fmt.Sprint(i), Chunks: cs, Readers: 1}); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if got := a.inflight.Load(); got != 2 {
			t.Fatalf("in-flight loads = %d, want 2", got)
		}
		if c := h.Counters(); c.ActivePrefetchJobs != 5 {
			t.Fatalf("active jobs = %d", c.ActivePrefetchJobs)
		}
		// A job blocked in its L2 load has answered the lookup phase; a
		// queued one has not. Neither peeking nor polling a running job
		// consumes it.
		for range 2 {
			for _, look := range []func(string) (PrefetchResult, error){h.PeekPrefetch, h.PollPrefetch} {
				r, err := look("0")
				if err != nil || r.Done || !r.LookupDone || r.LookupPrefixChunks != 1 {
					t.Fatalf("running job: %+v %v", r, err)
				}
				if r, err := look("4"); err != nil || r.Done || r.LookupDone {
					t.Fatalf("queued job: %+v %v", r, err)
				}
			}
		}
		time.Sleep(11 * time.Second) // first two time out, next two start
		synctest.Wait()
		// Peeking a done job does not consume it; the poll does.
		for range 2 {
			if r, err := h.PeekPrefetch("0"); err != nil || !r.Done || r.Err == nil {
				t.Fatalf("peek of the timed-out job: %+v %v", r, err)
			}
		}
		r, err := h.PollPrefetch("0")
		if err != nil || !r.Done || r.PrefixChunks != 0 || r.Err == nil {
			t.Fatalf("timed-out job: %+v %v", r, err)
		}
		close(a.gate)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i, id := range []string{"2", "3", "4"} {
			if r, err := h.WaitPrefetch(ctx, id); err != nil || r.PrefixChunks != 1 {
				t.Fatalf("job %s: %+v %v", id, r, err)
			}
			h.ReleaseRead(id, flat(chunks("", i+2, i+3, 1)), 1)
		}
		if a.maxInflight.Load() != 2 {
			t.Fatalf("max in-flight = %d, want 2", a.maxInflight.Load())
		}
		if c := h.Counters(); c.L1StagingObjects != 0 || c.ActivePrefetchJobs != 0 {
			t.Fatalf("after jobs: %+v", c)
		}
	})
}

type recListener struct {
	mu      sync.Mutex
	deleted []objkey.Key
}

func (r *recListener) OnStored([]objkey.Key, []int64) {}
func (r *recListener) OnAccessed([]objkey.Key)        {}
func (r *recListener) OnDeleted(ks []objkey.Key) {
	r.mu.Lock()
	r.deleted = append(r.deleted, ks...)
	r.mu.Unlock()
}

// TestL2Eviction: an adapter's "eviction" block. LRU evicts ratio of its
// tracked keys once the adapter crosses the watermark of its capacity;
// IsolatedLRU holds each salt to its quota and wipes salts without one.
// Deletions reach registered L2 listeners.
func TestL2Eviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lru, iso, unbounded := newFake("lru"), newFake("iso"), newFake("unbounded")
		lru.capacity = 10 * objSize
		h := start(t, Config{EvictionPolicy: PolicyNoop, L2: []AdapterConfig{
			{Eviction: &l2.EvictionConfig{Policy: PolicyLRU, TriggerWatermark: 0.8, EvictionRatio: 0.5}},
			{Eviction: &l2.EvictionConfig{Policy: PolicyIsolatedLRU}},
			{Eviction: &l2.EvictionConfig{Policy: PolicyLRU}},
		}}, lru, iso, unbounded)
		defer h.stop(t)
		rec := &recListener{}
		h.AddL2Listener(rec)
		h.SetQuota("a", 100*objSize)
		h.SetQuota("c", 4*objSize)
		a, b, c := flat(chunks("a", 0, 4, 1)), flat(chunks("b", 0, 4, 1)), flat(chunks("c", 0, 8, 1))
		h.mustPut(t, a)
		time.Sleep(10 * time.Millisecond) // a lands in L2 before b and c
		synctest.Wait()
		h.mustPut(t, b)
		h.mustPut(t, c) // 16 objects: lru is at 160% of capacity
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		time.Sleep(500 * time.Millisecond) // one eviction tick
		synctest.Wait()
		// lru: 16 tracked, ratio 0.5 → 8 victims, tail first of the oldest
		// request ("a" was stored first, so a's chunks go first).
		for _, k := range a {
			if _, ok := lru.has(k); ok {
				t.Fatalf("lru kept %v, oldest request must go first", k)
			}
		}
		if n := lru.count(); n != 8 {
			t.Fatalf("lru holds %d objects, want 8", n)
		}
		// iso: a within quota, b has no quota (wiped), c over 0.8×4 → 20%.
		for _, k := range a {
			if _, ok := iso.has(k); !ok {
				t.Fatalf("iso evicted %v within quota", k)
			}
		}
		for _, k := range b {
			if _, ok := iso.has(k); ok {
				t.Fatalf("iso kept %v of a salt without quota", k)
			}
		}
		if u := iso.Usage().BytesByCacheSalt["c"]; u != 7*objSize {
			t.Fatalf("salt c uses %d bytes, want 7 objects (8 minus 20%%)", u/objSize)
		}
		// unbounded adapter (capacity 0) is never aggregate-evicted.
		if n := unbounded.count(); n != 16 {
			t.Fatalf("unbounded adapter lost objects: %d", n)
		}
		cs := h.Counters()
		if cs.L2[0].EvictedObjects != 8 || cs.L2[1].EvictedObjects != 5 || cs.L2[2].EvictedObjects != 0 {
			t.Fatalf("evicted %d %d %d", cs.L2[0].EvictedObjects, cs.L2[1].EvictedObjects, cs.L2[2].EvictedObjects)
		}
		rec.mu.Lock()
		n := len(rec.deleted)
		rec.mu.Unlock()
		if n != 13 {
			t.Fatalf("listener saw %d deletions, want 13", n)
		}
		if !slices.Contains(h.Adapters(), AdapterInfo{Index: 1, TypeName: "iso"}) {
			t.Fatalf("adapters %+v", h.Adapters())
		}
	})
}

type l1Rec struct {
	mu                        sync.Mutex
	stored, accessed, deleted int
}

func (r *l1Rec) OnL1Stored(k []objkey.Key, _ []int64) { r.mu.Lock(); r.stored += len(k); r.mu.Unlock() }
func (r *l1Rec) OnL1Accessed(k []objkey.Key)          { r.mu.Lock(); r.accessed += len(k); r.mu.Unlock() }
func (r *l1Rec) OnL1Deleted(k []objkey.Key)           { r.mu.Lock(); r.deleted += len(k); r.mu.Unlock() }

// TestCrashedReaderLeaseExpires: a reader that locks and vanishes (no
// COMMIT_RETRIEVE, no FREE_LOOKUP_LOCKS) wedges nothing: after the read TTL
// the eviction loop may evict the object, and a temporary object loaded
// for it is reclaimed. L1 listeners see every store, access and delete.
func TestCrashedReaderLeaseExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newFake("a")
		h := start(t, Config{L1SizeBytes: 10 * objSize, L1ReadTTL: 30 * time.Second}, a)
		defer h.stop(t)
		rec := &l1Rec{}
		h.AddL1Listener(rec)
		cs := chunks("", 0, 9, 1)
		h.mustPut(t, flat(cs[:8])) // 80% of the pool
		a.put(cs[8][0], pattern(cs[8][0], objSize))
		if r := h.lookup(t, "crashed", cs); r.PrefixChunks != 9 || r.L2Keys != 1 {
			t.Fatalf("lookup %+v", r)
		}
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if c := h.Counters(); c.L1Objects != 9 || c.L1Evicted[""] != 0 {
			t.Fatalf("locked objects evicted: %+v", c)
		}
		time.Sleep(11 * time.Second)
		synctest.Wait()
		c := h.Counters()
		if c.L1Temporary != 0 || c.L1ReadLocked != 0 || c.L1ReadLeasesExpired == 0 {
			t.Fatalf("lease did not expire: %+v", c)
		}
		if c.L1Evicted[""] == 0 {
			t.Fatal("eviction still blocked by a crashed reader")
		}
		if _, err := h.ReadSlots(cs[0]); err == nil {
			t.Fatal("expired lock still readable")
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.stored != 9 || rec.accessed != 8 || rec.deleted < 2 {
			t.Fatalf("listener saw stored %d accessed %d deleted %d", rec.stored, rec.accessed, rec.deleted)
		}
	})
}

// TestStatusShape: the storage_manager section of /status carries
// upstream's keys with live values.
func TestStatusShape(t *testing.T) {
	a := newFake("fs")
	h := start(t, Config{L2: []AdapterConfig{{Eviction: &l2.EvictionConfig{Policy: PolicyLRU}}}}, a)
	defer h.stop(t)
	h.mustPut(t, flat(chunks("", 0, 2, 1)))
	st := h.Status()
	l1 := st["l1_manager"].(map[string]any)
	if l1["total_object_count"] != 2 || l1["memory_used_bytes"] != int64(2*objSize) || l1["read_ttl_seconds"] != 300.0 {
		t.Fatalf("l1_manager %v", l1)
	}
	ev := st["l1_eviction_controller"].(map[string]any)
	if ev["eviction_policy"] != PolicyLRU || ev["trigger_watermark"] != 0.8 || ev["eviction_ratio"] != 0.2 {
		t.Fatalf("l1_eviction_controller %v", ev)
	}
	if st["num_l2_adapters"] != 1 || len(st["l2_eviction_controller"].(map[string]any)["adapters"].([]any)) != 1 {
		t.Fatalf("status %v", st)
	}
	if st["is_healthy"] != true {
		t.Fatal("running engine reports unhealthy")
	}
}

// TestWriteBehindFaultWrappedFS: the real fs adapter behind the
// fault_inject wrapper. While the wrapper fails every call, nothing reaches
// disk, L1 keeps every object pinned (even past the eviction watermark) and
// the failures are counted; after recovery every pending upload lands on
// disk byte-identical.
func TestWriteBehindFaultWrappedFS(t *testing.T) {
	dir := t.TempDir()
	inner, err := openFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	fa := fault.New(inner, fault.Config{})
	defer fa.Close()
	fa.SetFailing(true)
	h := start(t, Config{EvictionInterval: 5 * time.Millisecond, StoreMaxAttempts: 1000, StoreRetryBase: time.Millisecond, StoreRetryMax: 20 * time.Millisecond}, fa)
	defer h.stop(t)
	keys := flat(chunks("", 0, 60, 1)) // 60 of 64 slots: above the watermark
	h.mustPut(t, keys)
	waitFor(t, func() bool { return h.Counters().L2[0].StoreFailed >= 10 })
	c := h.Counters()
	if c.L1Objects != 60 || c.L1PendingUpload != 60 || c.L1Evicted[""] != 0 || c.L1EvictionLoopTicks == 0 {
		t.Fatalf("L1 lost objects with pending uploads: %+v", c)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("%d files written while failing", len(ents))
	}
	fa.SetFailing(false)
	waitFor(t, func() bool { return h.Counters().L2[0].StoreObjects == 60 })
	for _, k := range keys {
		b, err := os.ReadFile(filepath.Join(dir, k.FSName()))
		if err != nil || !bytes.Equal(b, pattern(k, objSize)) {
			t.Fatalf("object %v after recovery: %v", k, err)
		}
	}
	if c := h.Counters(); c.L2[0].StoreAbandoned != 0 || c.L2[0].PendingStores != 0 {
		t.Fatalf("after recovery: %+v", c.L2[0])
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	polltest.Until(t, 30*time.Second, "the condition", cond)
}

// reconfFake is a fakeAdapter that accepts reconfiguration calls.
type reconfFake struct {
	*fakeAdapter
	ops []string
}

func (r *reconfFake) Reconfigure(_ context.Context, op string, args map[string]any) (map[string]any, error) {
	r.ops = append(r.ops, op)
	return map[string]any{"op": op, "args": args}, nil
}

func (r *reconfFake) ReconfigureStatus() map[string]any { return map[string]any{"backend": "fake"} }

// TestReconfigurePassThrough: calls reach a Reconfigurer unchanged; other
// adapters answer ErrUnsupported and a bad index ErrNotFound.
func TestReconfigurePassThrough(t *testing.T) {
	plain, rc := newFake("plain"), &reconfFake{fakeAdapter: newFake("rc")}
	e, err := New(Config{L1SizeBytes: 1 << 20}, []l2.Adapter{plain, rc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeChecked(t, e)
	if infos := e.Adapters(); infos[0].Reconfigurable || !infos[1].Reconfigurable {
		t.Fatalf("adapters %+v", infos)
	}
	ctx := context.Background()
	if _, err := e.Reconfigure(ctx, 0, "add", nil); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("plain adapter: %v", err)
	}
	if _, err := e.ReconfigureStatus(0); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("plain adapter status: %v", err)
	}
	if _, err := e.Reconfigure(ctx, 2, "add", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bad index: %v", err)
	}
	out, err := e.Reconfigure(ctx, 1, "resize", map[string]any{"size_bytes": 7})
	if err != nil || out["op"] != "resize" || out["args"].(map[string]any)["size_bytes"] != 7 || !slices.Equal(rc.ops, []string{"resize"}) {
		t.Fatalf("pass-through: %v %v (ops %v)", out, err, rc.ops)
	}
	if st, err := e.ReconfigureStatus(1); err != nil || st["backend"] != "fake" {
		t.Fatalf("status pass-through: %v %v", st, err)
	}
}

// storeEarlier leaves n one-chunk objects in dir as an earlier run's fs
// adapter would.
func storeEarlier(t *testing.T, dir string, n int) {
	t.Helper()
	earlier, err := openFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := flat(chunks("", 0, n, 1))
	if err := earlier.Store(context.Background(), old, payloads(old)); err != nil {
		t.Fatal(err)
	}
	if err := earlier.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestL2EvictionSeesRecoveredFiles: files an fs adapter recovered at start
// (left by an earlier run) count in its usage, so its eviction policy must
// know them: over the watermark they are evicted like the rest.
func TestL2EvictionSeesRecoveredFiles(t *testing.T) {
	dir := t.TempDir()
	storeEarlier(t, dir, 10)
	a, err := fs.New(fs.Config{BasePath: dir, PersistEnabled: true, RecoverOnStart: true, MaxCapacityBytes: 10 * objSize})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if u := a.Usage(); u.TotalBytesUsed != 10*objSize {
		t.Fatalf("recovered usage %d", u.TotalBytesUsed)
	}
	h := start(t, Config{EvictionInterval: 5 * time.Millisecond, L2: []AdapterConfig{
		{Eviction: &l2.EvictionConfig{Policy: PolicyLRU, TriggerWatermark: 0.8, EvictionRatio: 0.5}},
	}}, a)
	defer h.stop(t)
	// Full at start: one tick evicts half of the recovered files, after
	// which usage (50 %) is below the watermark.
	waitFor(t, func() bool { return h.Counters().L2[0].EvictedObjects > 0 })
	if c := h.Counters(); c.L2[0].EvictedObjects != 5 {
		t.Fatalf("evicted %d recovered files, want 5", c.L2[0].EvictedObjects)
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 5 {
		t.Fatalf("%d files left (%v), want 5", len(ents), err)
	}
	if u := a.Usage(); u.TotalBytesUsed != 5*objSize {
		t.Fatalf("usage after eviction %d", u.TotalBytesUsed)
	}
}

// TestPrefetchQueueOverflowCompletesWithL1Result: the L2 phase's queue
// holds prefetchQueueCap (4096) jobs; a job with misses that finds it full
// never asks L2: it completes at once with its L1 result (its resident
// prefix read-locked as usual) and is counted in PrefetchDropped, exactly
// once per such job. Run is started only at the end (so no worker drains
// the queue before), to settle the write-behind of the resident chunk.
func TestPrefetchQueueOverflowCompletesWithL1Result(t *testing.T) {
	if prefetchQueueCap != 4096 {
		t.Fatalf("prefetchQueueCap = %d, the documented bound is 4096", prefetchQueueCap)
	}
	a := newFake("mem")
	e, err := New(Config{L1SizeBytes: 64 * objSize}, []l2.Adapter{a}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterLayout(Layout{ModelName: "m", WorldSize: 1, ObjectBytes: objSize}); err != nil {
		t.Fatal(err)
	}
	cs := chunks("", 0, 2, 1) // chunk 0 resident, chunk 1 in no tier
	if _, err := e.Put(cs[0], payloads(cs[0])); err != nil {
		t.Fatal(err)
	}
	// Fill the queue: jobs with one missing key and no readers (they lock
	// nothing, so the engine holds no reference for them at Close).
	for i := range prefetchQueueCap {
		if err := e.Prefetch(PrefetchRequest{ID: fmt.Sprint("fill-", i), Chunks: cs[1:]}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.Counters().PrefetchDropped; got != 0 {
		t.Fatalf("PrefetchDropped = %d with the queue just full, want 0", got)
	}
	if r, err := e.PeekPrefetch("fill-4095"); err != nil || r.Done {
		t.Fatalf("the last queued job: %+v %v, want queued (not done)", r, err)
	}
	for i := range 3 {
		id := fmt.Sprint("over-", i)
		if err := e.Prefetch(PrefetchRequest{ID: id, Chunks: cs, Readers: 1}); err != nil {
			t.Fatal(err)
		}
		r, err := e.PollPrefetch(id)
		if err != nil || !r.Done || r.PrefixChunks != 1 || r.L1Keys != 1 || r.L2Keys != 0 || r.TotalKeys != 2 || r.Err != nil {
			t.Fatalf("dropped job %s: %+v %v, want done with its L1 result (1 chunk, 1 key)", id, r, err)
		}
		if got := e.Counters().PrefetchDropped; got != int64(i+1) {
			t.Fatalf("PrefetchDropped = %d after %d overflowing jobs, want %d", got, i+1, i+1)
		}
		// The L1 prefix is read-locked for the job, as for any lookup.
		if n := e.ReleaseRead(id, cs[0], 1); n != 1 {
			t.Fatalf("released %d read locks of %s, want 1", n, id)
		}
	}
	// Run uploads the resident chunk (its write-behind pin is the only
	// reference left); stop then checks that nothing else is held.
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{Engine: e, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- e.Run(ctx) }()
	waitFor(t, func() bool { _, ok := a.has(cs[0][0]); return ok })
	h.stop(t)
}
