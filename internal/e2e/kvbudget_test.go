package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestKVBodyBudgetFlags: --http-kv-max-body-mb and --http-kv-body-budget-mb
// reach a real server's HTTP API. With a 1 MiB cap on one store, a
// raw-body store of 130 chunks (1,064,960 bytes, far under the 1 GiB
// default) is 413 naming the cap, and one of 100 chunks is stored. With a
// 1 MiB budget, a retrieve of those 100 chunks in upstream's tensor form
// (which holds 2 x 8 KiB a chunk while it is built) is answered with the
// 64 chunks that fit, byte-exact, where the default budget returns all.
func TestKVBodyBudgetFlags(t *testing.T) {
	for _, c := range []struct {
		flag      string
		retrieved int
	}{
		{"--http-kv-max-body-mb", 100},
		{"--http-kv-body-budget-mb", 64},
	} {
		t.Run(strings.TrimPrefix(c.flag, "--"), func(t *testing.T) {
			httpPort, zmqPort := freePort(t), freePort(t)
			base := "http://127.0.0.1:" + itoa(httpPort)
			shm := shmName(t, "budget")
			startServerKV(t, "kv-budget", httpPort, zmqPort, shm, c.flag, "1")
			dialWorker(t, zmqPort, shm) // registers "m": 2 layers x 64 fp16
			headers := func(chunks int) map[string]string {
				parts := make([]string, chunks*chunkSize)
				for i := range parts {
					parts[i] = itoa(40_000 + i)
				}
				return map[string]string{"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": strings.Join(parts, ","), "Content-Type": "application/x-lmcache-kv; v=1"}
			}
			var out map[string]any
			if code, _ := call(t, "POST", base+"/api/kv/store", kvTensor(130*chunkSize, 3), headers(130), &out); code != http.StatusRequestEntityTooLarge ||
				!strings.Contains(out["detail"].(string), "store of 1064960 bytes exceeds the 1048576-byte limit") {
				t.Fatalf("store of 130 chunks = %d %v, want 413 naming the 1 MiB cap", code, out)
			}
			if code, _ := call(t, "POST", base+"/api/kv/store", kvTensor(100*chunkSize, 5), headers(100), &out); code != http.StatusOK || out["stored_chunks"] != float64(100) {
				t.Fatalf("store of 100 chunks = %d %v", code, out)
			}
			req, err := http.NewRequest("POST", base+"/api/kv/retrieve", nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range headers(100) {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK || res.Header.Get("X-LMCache-Hit-Chunks") != itoa(c.retrieved) {
				t.Fatalf("retrieve = %d, %s chunks, want %d", res.StatusCode, res.Header.Get("X-LMCache-Hit-Chunks"), c.retrieved)
			}
			// KV_2LTD [2, 2 layers, tokens, 64] fp16: the first tokens of
			// each of the 4 planes of what was stored.
			want := kvTensor(100*chunkSize, 5)
			plane, got := 100*chunkSize*64*2, c.retrieved*chunkSize*64*2
			if len(body) != 4*got {
				t.Fatalf("retrieve answered %d bytes, want %d", len(body), 4*got)
			}
			for p := range 4 {
				if string(body[p*got:(p+1)*got]) != string(want[p*plane:p*plane+got]) {
					t.Fatalf("plane %d of the %d retrieved chunks differs from what was stored", p, c.retrieved)
				}
			}
		})
	}
}
