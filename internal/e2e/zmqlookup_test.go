package e2e

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestZMQLookupOfHTTPPrimedKV primes KV through the HTTP bytes API of a
// server started with --hash-root-hex and looks the prompt up over ZMQ: both
// front ends must derive the same keys from the same root, and the ZMQ
// lookup must show in /metrics and /status like an HTTP one.
func TestZMQLookupOfHTTPPrimedKV(t *testing.T) {
	httpPort, zmqPort := freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	start(t, "server-root", nil, "server", "--http-port", itoa(httpPort), "--port", itoa(zmqPort),
		"--chunk-size", itoa(chunkSize), "--l1-size-gb", "0.0625", "--hash-root-hex", strings.Repeat("ab", 32),
		"--register-model", `{"model_name":"m","world_size":1,"object_bytes":8192}`)
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))

	toks := tokens(500)
	hdr := map[string]string{"X-LMCache-Model": "m", "X-LMCache-Tokens": tokenHeader(toks)}
	if code, _ := call(t, "POST", base+"/api/kv/store", bytes.Repeat([]byte{7}, 8*8192), hdr, nil); code != http.StatusOK {
		t.Fatalf("store: %d", code)
	}
	c, err := mqclient.Dial("tcp://127.0.0.1:"+itoa(zmqPort), mqclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids := make([]wire.Int, len(toks))
	for i, v := range toks {
		ids[i] = wire.Int(v)
	}
	key := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: ids, End: wire.Int(len(ids)), RequestID: "root-check", NumKVReaders: 1}
	hits, err := c.LookupWait(key, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if hits != 8 {
		t.Fatalf("ZMQ LOOKUP found %d chunks of 8 stored over HTTP with the same root", hits)
	}
	if err := c.FreeLookupLocks(key, 1); err != nil {
		t.Fatal(err)
	}

	// The data path's lookup shows in /metrics (upstream names) and its
	// session in /status.
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`lmcache_mp_lookup_hit_tokens_total{cache_salt="",model_name="m"} 128`,
		`lmcache_mp_lookups_requests_total{cache_salt="",model_name="m"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	var status struct {
		ActiveSessions int `json:"active_sessions"`
	}
	if code, _ := call(t, "GET", base+"/status", nil, nil, &status); code != http.StatusOK || status.ActiveSessions != 1 {
		t.Errorf("/status = %d, active_sessions %d; want the LOOKUP's session", code, status.ActiveSessions)
	}
}
