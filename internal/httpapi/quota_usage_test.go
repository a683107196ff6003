package httpapi_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
)

// usageCounting counts its adapter's Usage calls.
type usageCounting struct {
	l2.Adapter
	calls *atomic.Int64
}

func (u usageCounting) Usage() l2.Usage {
	u.calls.Add(1)
	return u.Adapter.Usage()
}

// TestQuotaListReadsUsageOnce: GET /quota with 50 quotas reads the
// adapter's usage (a copy of its per-salt map under the adapter's
// bookkeeping lock) once, not once per quota, and still reports each
// salt's own usage.
func TestQuotaListReadsUsageOnce(t *testing.T) {
	fsA, _ := newFS(t)
	var calls atomic.Int64
	e := start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{usageCounting{fsA, &calls}}})
	for i := range 50 {
		e.expect(http.StatusOK, "PUT", fmt.Sprintf("/quota/t%d", i), map[string]any{"limit_gb": 1})
	}
	e.store(tokens(0, testChunk), "t7", payload(1, 7))
	drainWriteBehind(t, e.eng)
	calls.Store(0)
	users := e.expect(http.StatusOK, "GET", "/quota", nil).json(t)["users"].(map[string]any)
	if n := calls.Load(); n != 1 {
		t.Fatalf("GET /quota of 50 quotas read the adapter's usage %d times, want 1", n)
	}
	if len(users) != 50 {
		t.Fatalf("GET /quota listed %d users, want 50", len(users))
	}
	if u := users["t7"].(map[string]any)["current_usage_gb"].(float64); u <= 0 {
		t.Fatalf("t7 usage %v, want the stored object's bytes", u)
	}
	if u := users["t8"].(map[string]any)["current_usage_gb"].(float64); u != 0 {
		t.Fatalf("t8 usage %v, want 0", u)
	}
}
