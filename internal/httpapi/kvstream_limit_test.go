package httpapi_test

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestKVStreamOverLimitRefusedBeforeReserving: a framed store whose
// manifest announces more chunk bytes than the per-request limit
// (--http-kv-max-body-mb) is 413 naming both sizes before any of the
// in-flight KV budget is taken, as the raw-body form is; before, a
// chunked body took the budget for every announced chunk and held it
// until the limit was read, refusing other stores and retrieves with 503
// for a store that could only fail. A stream within the limit still
// reserves and is stored.
func TestKVStreamOverLimitRefusedBeforeReserving(t *testing.T) {
	held := make(chan int64, 8)
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.MaxKVBodyBytes = 1500
		httpapi.OnBudgetAcquired(o, func(n int64) { held <- n })
	}})
	one := kvOne.storeStream(tokSlice(0, testChunk), kvOne.tensor(1, 1), 1, "")
	if r := streamed(t, e, "POST", "/api/kv/store", one, streamCT); r.code != 200 || !strings.Contains(string(r.body), `"stored_chunks":1`) {
		t.Fatalf("framed store of one chunk under the limit: %d %s", r.code, r.body)
	}
	if n := nextHold(t, held); n != objBytes {
		t.Fatalf("the store under the limit reserved %d bytes, want %d", n, objBytes)
	}

	two := kvOne.storeStream(tokSlice(1000, 2*testChunk), kvOne.tensor(2, 2), 2, "")
	r := streamed(t, e, "POST", "/api/kv/store", two, streamCT)
	// The hook runs inside the handler before it answers, so a
	// reservation would already be in the channel.
	select {
	case n := <-held:
		t.Errorf("a store over the per-request limit reserved %d bytes of the KV budget", n)
	default:
	}
	if r.code != 413 || string(r.body) != `{"detail":"store of 2048 bytes exceeds the 1500-byte limit"}` {
		t.Fatalf("framed store of 2048 chunk bytes over the 1500-byte limit: %d %s", r.code, r.body)
	}
	if lk := e.expect(200, "POST", "/api/kv/lookup", map[string]any{"model_name": testModel, "tokens": tokSlice(1000, 2*testChunk)}, jsonCT).json(t); lk["hit_chunks"] != float64(0) {
		t.Fatalf("the refused store left chunks: %v", lk)
	}
}
