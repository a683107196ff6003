package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// panickyLoad is a fake adapter whose first Load panics, as a faulty
// adapter would; the prefetch worker loop recovers it.
type panickyLoad struct {
	*fakeAdapter
	once sync.Once
}

func (p *panickyLoad) Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error) {
	p.once.Do(func() { panic("adapter load failed") })
	return p.fakeAdapter.Load(ctx, keys, dst)
}

// TestPanickedLoadReleasesItsBuffers: the L1 buffers staged for an L2 load
// have no write lease, so the job must release them however the load ends;
// when the adapter's Load panics (the worker loop recovers and goes on)
// they are aborted, not left staged for good (the harness's leak check at
// stop names any staged write left), and the job still completes, with the
// panic as its error, so its waiter gets an answer.
func TestPanickedLoadReleasesItsBuffers(t *testing.T) {
	fake := newFake("l2")
	a := &panickyLoad{fakeAdapter: fake}
	h := start(t, Config{}, a)
	defer h.stop(t)
	cs := chunks("", 0, 2, 1)
	for _, k := range flat(cs) {
		fake.put(k, pattern(k, objSize))
	}
	if err := h.Prefetch(PrefetchRequest{ID: "p", Chunks: cs, Sparse: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := h.WaitPrefetch(ctx, "p")
	if err != nil {
		t.Fatalf("job of the panicked load: %v, want it completed", err)
	}
	if res.Err == nil || !strings.Contains(res.Err.Error(), "prefetch L2 phase panicked: adapter load failed") || res.PrefixChunks != 0 {
		t.Fatalf("job result %+v, want 0 chunks and the panic as its error", res)
	}
	if c := h.Counters(); c.L1StagingObjects != 0 || c.L1StagingBytes != 0 {
		t.Fatalf("after a panicked load: %d staging objects (%d bytes), want 0", c.L1StagingObjects, c.L1StagingBytes)
	}
}
