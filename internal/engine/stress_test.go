package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestConcurrentStress runs writers (reserve/commit and Put), lookups that
// read every locked byte, L2 prefetches, eviction every few milliseconds,
// deletes and clears at once against a pool far smaller than the key space,
// with a flaky L2 adapter. Every byte a reader sees under its read lock must
// be the pattern of the key it asked for, and a writer's staged bytes must
// survive until its commit: any double allocation, premature free or reuse
// of a read-locked slot shows up as a mismatch.
func TestConcurrentStress(t *testing.T) {
	const (
		world   = 2
		nChunks = 120
		iters   = 250
		size    = 16 << 10
	)
	fake := newFake("flaky")
	h := start(t, Config{
		L1SizeBytes:              160 * size,
		EvictionInterval:         3 * time.Millisecond,
		EvictionTriggerWatermark: 0.5,
		EvictionRatio:            0.3,
		StoreRetryBase:           time.Millisecond,
		StoreRetryMax:            5 * time.Millisecond,
		StoreMaxAttempts:         4,
	}, fake)
	for w := 1; w <= world; w++ {
		if err := h.RegisterLayout(Layout{ModelName: "m", WorldSize: w, ObjectBytes: size}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg                      sync.WaitGroup
		mismatches, oom         atomic.Int64
		verified, stored, found atomic.Int64
		cleared                 atomic.Int64
		stop                    = make(chan struct{})
	)
	salts := []string{"", "t1"}
	randRange := func(r *rand.Rand) (string, int, int) {
		c := r.IntN(nChunks - 8)
		return salts[r.IntN(len(salts))], c, c + 1 + r.IntN(8)
	}
	fail := func(format string, args ...any) {
		mismatches.Add(1)
		t.Errorf(format, args...)
	}
	// Writers: engine-driven PREPARE_STORE/COMMIT_STORE of every rank.
	for w := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			tag := fmt.Sprintf("inst%d", w)
			for range iters {
				salt, from, to := randRange(r)
				keys := flat(chunks(salt, from, to, world))
				sizes := make([]int64, len(keys))
				for i := range sizes {
					sizes[i] = size
				}
				slots, err := h.ReserveWrite(tag, keys, sizes)
				if errors.Is(err, ErrOutOfMemory) {
					oom.Add(1)
					continue
				}
				if err != nil {
					fail("reserve: %v", err)
					return
				}
				var staged []objkey.Key
				for i, s := range slots {
					if s.Valid() {
						copy(h.Bytes(s), pattern(keys[i], size))
						staged = append(staged, keys[i])
					}
				}
				for i, s := range slots {
					if s.Valid() && !bytes.Equal(h.Bytes(s), pattern(keys[i], size)) {
						fail("staged bytes of %v clobbered before commit", keys[i])
					}
				}
				n, err := h.CommitWrite(tag, staged)
				if err != nil {
					fail("commit: %v", err)
				}
				stored.Add(int64(n))
			}
		})
	}
	// A Put writer (bytes-level API), one rank at a time.
	wg.Go(func() {
		r := rand.New(rand.NewPCG(99, 1))
		for range iters {
			salt, from, to := randRange(r)
			var keys []objkey.Key
			for c := from; c < to; c++ {
				keys = append(keys, mkKey(salt, c, r.IntN(world), world))
			}
			data := make([][]byte, len(keys))
			for i, k := range keys {
				data[i] = pattern(k, size)
			}
			if _, err := h.Put(keys, data); err != nil && !errors.Is(err, ErrOutOfMemory) {
				fail("put: %v", err)
			}
		}
	})
	// Readers: LOOKUP (with L2 prefetch), PREPARE_RETRIEVE, verify,
	// COMMIT_RETRIEVE.
	for rd := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(100+rd), 2))
			for i := range iters {
				salt, from, to := randRange(r)
				cs := chunks(salt, from, to, world)
				id := fmt.Sprintf("r%d-%d", rd, i)
				if err := h.Prefetch(PrefetchRequest{ID: id, Chunks: cs, Readers: 1}); err != nil {
					fail("prefetch: %v", err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				res, err := h.WaitPrefetch(ctx, id)
				cancel()
				if err != nil {
					fail("wait: %v", err)
					return
				}
				keys := flat(cs[:res.PrefixChunks])
				found.Add(int64(len(keys)))
				if len(keys) > 0 {
					slots, err := h.ReadSlots(keys)
					if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotReadable) {
						// A concurrent CLEAR or forced delete removed a
						// locked object (its bytes stay valid, but it is
						// no longer retrievable by key); a writer may have
						// stored a fresh, unlocked copy under the key since
						// (ErrNotReadable).
						cleared.Add(1)
					} else if err != nil {
						fail("retrieve of locked prefix: %v", err)
					}
					for j, s := range slots {
						if !bytes.Equal(h.Bytes(s), pattern(keys[j], size)) {
							fail("bytes of %v differ under read lock", keys[j])
						}
						verified.Add(1)
					}
				}
				h.ReleaseRead(id, flat(cs), 1)
			}
		})
	}
	// Get readers, deletes, occasional clears and L2 outages until the
	// bounded goroutines are done.
	var helper sync.WaitGroup
	helper.Go(func() {
		r := rand.New(rand.NewPCG(7, 7))
		for {
			select {
			case <-stop:
				return
			default:
			}
			salt, from, to := randRange(r)
			keys := flat(chunks(salt, from, to, world))
			got, _ := h.Get(keys)
			for i, b := range got {
				if b != nil && !bytes.Equal(b, pattern(keys[i], size)) {
					fail("Get of %v returned wrong bytes", keys[i])
				}
			}
			switch r.IntN(80) {
			case 0:
				h.Clear()
			case 1, 2, 3:
				h.DeleteL1(keys, r.IntN(2) == 0)
			case 4:
				fake.failing.Store(true)
			case 5, 6, 7, 8:
				fake.failing.Store(false)
			}
			time.Sleep(200 * time.Microsecond)
		}
	})
	wg.Wait() // writers and readers are bounded
	close(stop)
	helper.Wait()
	fake.failing.Store(false)
	c := h.Counters()
	h.stop(t)
	if mismatches.Load() != 0 {
		t.Fatalf("%d mismatches", mismatches.Load())
	}
	t.Logf("cleared under lookups %d, stored %d, verified %d bytes-checked objects (%d found), oom %d, evicted %v, l2 loads %d, l2 stores %d, retries %d, abandoned %d",
		cleared.Load(), stored.Load(), verified.Load(), found.Load(), oom.Load(), c.L1Evicted, c.L2[0].LoadObjects, c.L2[0].StoreObjects, c.L2[0].StoreRetried, c.L2[0].StoreAbandoned)
	if verified.Load() == 0 || stored.Load() == 0 {
		t.Fatal("stress verified nothing")
	}
	if c.L1EvictionLoopTriggered == 0 {
		t.Fatal("eviction never ran; the pool is not under pressure")
	}
}
