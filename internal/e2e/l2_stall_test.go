package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/s3test"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestL2StalledS3LookupBudget runs the binary over a real versitygw that is
// frozen with SIGSTOP (a stalled, not dead, S3). The HTTP lookup route and
// the ZMQ LOOKUP that vLLM uses both answer 200 / a count with the L1
// prefix although S3 never answers: the S3 op timeout (60 s) is longer
// than both clients' deadlines (30 s HTTP, 20 s ZMQ), so only
// --l2-lookup-timeout-ms can end the wait, and each such lookup is counted
// in lmcache_mp_l2_prefetch_failure_total{reason="lookup_timeout"}. Stores
// during the stall open the breaker (slow calls); after SIGCONT every
// upload lands in the bucket under its upstream name.
func TestL2StalledS3LookupBudget(t *testing.T) {
	s3 := s3test.Versity(t)
	adapter, _ := json.Marshal(map[string]any{
		"type": "s3", "s3_endpoint": s3.Endpoint, "s3_region": s3test.Region, "disable_tls": true,
		"s3_addressing_style": "path", "s3_bucket": s3.Bucket,
		"aws_access_key_id": s3.AccessKey, "aws_secret_access_key": s3.SecretKey,
		"s3_max_attempts": 1, "s3_op_timeout_s": 60, "s3_slow_call_s": 1, "s3_breaker_cooldown_s": 0.2,
	})
	layout := fmt.Sprintf(`{"model_name":%q,"world_size":1,"num_layers":2,"hidden_size":64,"dtype":"float16","object_bytes":%d}`, model, objectBytes)
	httpPort, zmqPort := freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	start(t, "server-stall", nil, "server", "--http-port", itoa(httpPort), "--port", itoa(zmqPort),
		"--l1-size-gb", "0.0625", "--chunk-size", itoa(chunkSize), "--l2-adapter", string(adapter),
		"--register-model", layout, "--l2-lookup-timeout-ms", "200",
		"--l2-store-max-retries", "1000", "--l2-store-retry-backoff-seconds", "0.01")
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))

	stored := tokens(0) // 8 chunks
	store := func(toks []int64) {
		t.Helper()
		hdr := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(toks), "X-LMCache-Cache-Salt": salt}
		if code, _ := call(t, "POST", base+"/api/kv/store", bytes.Repeat([]byte{3}, 8*objectBytes), hdr, nil); code != http.StatusOK {
			t.Fatalf("store: %d", code)
		}
	}
	inBucket := func(names []string) func() bool {
		return func() bool {
			have := s3.Keys(t, s3.Bucket)
			for _, n := range names {
				if !slices.Contains(have, n) {
					return false
				}
			}
			return true
		}
	}
	store(stored)
	waitFor(t, "first uploads in the bucket", inBucket(s3Names(t, stored)))

	// The query: the 8 stored chunks, then one chunk nobody holds, so the
	// lookup must ask S3 about it.
	query := append(slices.Clone(stored), tokens(10_000)[:chunkSize]...)
	adapterStatus := func() map[string]any {
		var st struct {
			SM struct {
				L2 []map[string]any `json:"l2_adapters"`
			} `json:"storage_manager"`
		}
		call(t, "GET", base+"/status", nil, nil, &st)
		if len(st.SM.L2) != 1 {
			t.Fatalf("/status lists %d L2 adapters", len(st.SM.L2))
		}
		return st.SM.L2[0]
	}
	// A loaded machine may have made a setup upload slow; fresh answers from
	// the healthy S3 (404s for an absent prompt) clear the breaker's count.
	absent := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(tokens(50_000)), "X-LMCache-Cache-Salt": salt}
	waitFor(t, "a healthy breaker before the stall", func() bool {
		call(t, "POST", base+"/api/kv/lookup", nil, absent, nil)
		st := adapterStatus()
		return st["breaker_state"] == "closed" && st["connection_failures"] == float64(0)
	})
	timeouts := func() int {
		resp, err := client.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, `lmcache_mp_l2_prefetch_failure_total{reason="lookup_timeout"} `); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("metric line %q: %v", line, err)
				}
				return n
			}
		}
		t.Fatal(`/metrics lacks lmcache_mp_l2_prefetch_failure_total{reason="lookup_timeout"}`)
		return 0
	}
	// Warm-up lookups on a loaded machine may have run out of budget too.
	before := timeouts()

	if err := s3.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = s3.Thaw()
		}
	}()
	var res struct {
		HitChunks   int `json:"hit_chunks"`
		TotalChunks int `json:"total_chunks"`
		L1Keys      int `json:"l1_keys"`
	}
	hdr := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(query), "X-LMCache-Cache-Salt": salt}
	if code, _ := call(t, "POST", base+"/api/kv/lookup", nil, hdr, &res); code != http.StatusOK || res.HitChunks != 8 || res.TotalChunks != 9 || res.L1Keys != 8 {
		t.Fatalf("HTTP lookup against the stalled S3: %d %+v; want 200 with the 8-chunk L1 prefix", code, res)
	}
	if got := timeouts(); got != before+1 {
		t.Fatalf("lookup_timeout after the HTTP lookup = %d, want %d", got, before+1)
	}

	c, err := mqclient.Dial("tcp://127.0.0.1:"+itoa(zmqPort), mqclient.Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids := make([]wire.Int, len(query))
	for i, v := range query {
		ids[i] = wire.Int(v)
	}
	key := &wire.Key{ModelName: model, WorldSize: 1, TokenIDs: ids, End: wire.Int(len(ids)), RequestID: "stalled", NumKVReaders: 1, CacheSalt: salt}
	hits, err := c.LookupWait(key, 10*time.Millisecond)
	if err != nil || hits != 8 {
		t.Fatalf("ZMQ LOOKUP against the stalled S3: %d chunks, %v; want the 8-chunk L1 prefix", hits, err)
	}
	if err := c.FreeLookupLocks(key, 1); err != nil {
		t.Fatal(err)
	}
	if got := timeouts(); got != before+2 {
		t.Fatalf("lookup_timeout after the ZMQ lookup = %d, want %d", got, before+2)
	}

	// Stores during the stall: their uploads hang, count slow, open the breaker.
	pending := tokens(20_000)
	store(pending)
	waitFor(t, "the breaker to open on slow uploads", func() bool { return adapterStatus()["breaker_state"] == "open" })

	if err := s3.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	waitFor(t, "the uploads queued during the stall in the bucket", inBucket(s3Names(t, pending)))
	if n := len(s3.Keys(t, s3.Bucket)); n != 16 {
		t.Fatalf("bucket holds %d objects, want 16", n)
	}
}
