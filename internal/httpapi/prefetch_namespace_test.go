package httpapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestPollPrefetchSeesOnlyWarmJobs: GET /cache/prefetches/{request_id}
// reports and consumes only the warm prefetches POST /cache/prefetches
// submitted. The engine keys every prefetch job by its request id,
// vLLM's LOOKUP jobs (the raw vLLM request id) and the KV API's probes
// included, so polling a vLLM request id took that lookup's answer from
// its worker (exactly-once) and left the read locks it holds to nobody.
func TestPollPrefetchSeesOnlyWarmJobs(t *testing.T) {
	e := start(t, envOpts{})
	toks := tokSlice(0, testChunk)
	e.store(tokens(0, testChunk), "", payload(1, 9))
	keys := keysFor(t, toks, "")

	// A data-path lookup, as mq starts one for a vLLM LOOKUP.
	const vllmID = "cmpl-0123456789abcdef0123456789abcdef-0"
	if err := e.eng.Prefetch(engine.PrefetchRequest{ID: vllmID, Chunks: [][]objkey.Key{keys}, Readers: 1}); err != nil {
		t.Fatal(err)
	}
	if m := e.expect(404, "GET", "/cache/prefetches/"+vllmID, nil).json(t); m["detail"] != "unknown prefetch request_id='"+vllmID+"' (already completed or never submitted)" {
		t.Errorf("poll of a vLLM lookup: %v", m)
	}
	// The lookup's answer is still its worker's, locks and all.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := e.eng.WaitPrefetch(ctx, vllmID)
	if err != nil {
		t.Fatalf("the vLLM lookup's answer was taken: %v", err)
	}
	if res.PrefixChunks != 1 {
		t.Errorf("lookup prefix = %d, want 1", res.PrefixChunks)
	}
	if n := e.eng.ReleaseRead(vllmID, keys, 1); n != len(keys) {
		t.Errorf("released %d read locks, want %d", n, len(keys))
	}

	// A warm prefetch is still polled to completion by its request_id,
	// exactly once.
	sub := e.expect(202, "POST", "/cache/prefetches", map[string]any{"model_name": testModel, "world_size": 1, "token_ids": toks}).json(t)
	id, _ := sub["request_id"].(string)
	if len(id) != 32 {
		t.Fatalf("submit = %v", sub)
	}
	waitFor(t, "the warm prefetch to complete", func() bool {
		return e.expect(200, "GET", "/cache/prefetches/"+id, nil).json(t)["status"] == "completed"
	})
	e.expect(404, "GET", "/cache/prefetches/"+id, nil)
}
