package e2e

import (
	"net/http"
	"strings"
	"testing"
)

// TestKVBodyBudgetFlag: --http-kv-body-budget-mb reaches a real server's
// HTTP API. With a 1 MiB budget, a raw-body store of 130 chunks (1,064,960
// bytes, far under the 1 GiB per-request cap) is refused with 413 naming
// the budget, and a store of 2 chunks of the same model is stored.
func TestKVBodyBudgetFlag(t *testing.T) {
	httpPort, zmqPort := freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	shm := shmName(t, "budget")
	startServerKV(t, "kv-budget", httpPort, zmqPort, shm, "--http-kv-body-budget-mb", "1")
	dialWorker(t, zmqPort, shm) // registers "m": 2 layers x 64 fp16
	store := func(chunks int) (int, map[string]any) {
		parts := make([]string, chunks*chunkSize)
		for i := range parts {
			parts[i] = itoa(40_000 + i)
		}
		var out map[string]any
		code, _ := call(t, "POST", base+"/api/kv/store", kvTensor(chunks*chunkSize, 3), map[string]string{"X-LMCache-Model-Name": "m",
			"X-LMCache-Tokens": strings.Join(parts, ","), "Content-Type": "application/x-lmcache-kv; v=1"}, &out)
		return code, out
	}
	if code, out := store(130); code != http.StatusRequestEntityTooLarge || !strings.Contains(out["detail"].(string), "exceeds the 1048576-byte in-flight budget") {
		t.Fatalf("store of 130 chunks = %d %v, want 413 naming the budget", code, out)
	}
	if code, out := store(2); code != http.StatusOK || out["stored_chunks"] != float64(2) {
		t.Fatalf("store of 2 chunks = %d %v", code, out)
	}
}
