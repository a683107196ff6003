package engine

import (
	"bytes"
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestSlowL2LoadKeepsItsBuffer: the L1 buffer an L2 load writes into is
// not reclaimed while the load runs, however long it takes. It was staged
// under the write lease of client reservations (--l1-write-ttl-seconds),
// so a load slower than that lease had its buffer freed by the eviction
// tick's sweep and handed to the next store, and the late load then wrote
// the L2 object over that store's bytes (and the lookup missed).
func TestSlowL2LoadKeepsItsBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake("slow")
		fake.gate = make(chan struct{})
		h := start(t, Config{L1WriteTTL: time.Second}, fake)
		defer h.stop(t)
		cs := chunks("", 0, 1, 1)
		for _, k := range flat(cs) {
			fake.put(k, pattern(k, objSize))
		}
		if err := h.Prefetch(PrefetchRequest{ID: "slow", Chunks: cs, Readers: 1}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := fake.inflight.Load(); n != 1 {
			t.Fatalf("%d loads in flight, want the lookup's one", n)
		}
		time.Sleep(5 * time.Second) // five sweeps, the write lease long over
		synctest.Wait()
		if st := h.table.Stats(); st.StagingObjects != 1 || st.ExpiredWrites != 0 {
			t.Fatalf("load's buffer reclaimed during the load: %+v", st)
		}
		other := []objkey.Key{mkKey("", 99, 0, 1)}
		h.mustPut(t, other)
		close(fake.gate)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := h.WaitPrefetch(ctx, "slow")
		if err != nil || res.PrefixChunks != 1 || res.L2Keys != 1 {
			t.Fatalf("lookup %+v, %v; want the chunk loaded from L2", res, err)
		}
		got, err := h.Get(other)
		if err != nil || !bytes.Equal(got[0], pattern(other[0], objSize)) {
			t.Fatalf("the store made during the load reads back other bytes (%v)", err)
		}
		h.mustReadBack(t, flat(cs))
		h.ReleaseRead("slow", flat(cs), 1)
	})
}
