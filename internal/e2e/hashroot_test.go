package e2e

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestHashRootSharedByHTTPAndZMQ primes KV through the HTTP bytes API of a
// server started with --hash-root-hex and looks the prompt up over ZMQ: both
// front ends must derive the same keys from the same root.
func TestHashRootSharedByHTTPAndZMQ(t *testing.T) {
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
}
