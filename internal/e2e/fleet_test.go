package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/proctest"
	"github.com/lmcache-go/lmcache/internal/s3test"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// TestMain removes the built binary after the run and checks for leaked
// goroutines.
func TestMain(m *testing.M) { proctest.Main(m) }

const (
	chunkSize   = 16
	objectBytes = 8192 // per chunk and rank, fixed by --register-model
	salt        = "tenant"
	model       = "org/m"
)

type quotaView struct {
	CacheSalt    string  `json:"cache_salt"`
	QuotaLimitGB float64 `json:"quota_limit_gb"`
	UsageGB      float64 `json:"usage_gb"`
}

func gbToBytes(gb float64) int64 { return int64(math.Round(gb * (1 << 30))) }

func tokens(from int) []int64 {
	out := make([]int64, 8*chunkSize)
	for i := range out {
		out[i] = int64(from + i)
	}
	return out
}

func tokenHeader(toks []int64) string {
	s := make([]string, len(toks))
	for i, t := range toks {
		s[i] = fmt.Sprint(t)
	}
	return strings.Join(s, ",")
}

// s3Names returns the S3 object names of a prompt's chunks, computed with
// the shared hashing and naming packages (the names upstream would write).
func s3Names(t *testing.T, toks []int64) []string {
	h, err := tokenhash.New(tokenhash.Blake3, chunkSize)
	if err != nil {
		t.Fatal(err)
	}
	hashes, err := h.ChunkHashes(toks)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := objkey.FanOut(hashes, model, 1, -1, nil, salt)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range groups[0] {
		out = append(out, k.S3Name())
	}
	return out
}

// TestFleetEvictionResyncAndWarmPrefetch runs one coordinator and two
// servers sharing one versitygw bucket, all as real processes.
func TestFleetEvictionResyncAndWarmPrefetch(t *testing.T) {
	s3 := s3test.Versity(t)
	adapter, _ := json.Marshal(map[string]any{
		"type": "s3", "s3_endpoint": s3.Endpoint, "s3_region": s3test.Region, "disable_tls": true,
		"s3_addressing_style": "path", "s3_bucket": s3.Bucket,
		"aws_access_key_id": s3.AccessKey, "aws_secret_access_key": s3.SecretKey,
	})
	layout := fmt.Sprintf(`{"model_name":%q,"world_size":1,"num_layers":2,"hidden_size":64,"dtype":"float16","object_bytes":%d}`, model, objectBytes)

	coordPort := freePort(t)
	coordURL := "http://127.0.0.1:" + itoa(coordPort)
	startCoordinator := func(name string) *proc {
		p := start(t, name, []string{"LMCACHE_MP_COORDINATOR_RESYNC_POLL_INTERVAL=0.2"},
			"coordinator", "--host", "127.0.0.1", "--port", itoa(coordPort),
			"--eviction-check-interval", "0.5", "--health-check-interval", "1", "--chunk-size", itoa(chunkSize))
		waitFor(t, name+" healthz", healthy(coordURL+"/healthz"))
		return p
	}
	coord := startCoordinator("coordinator")

	servers := map[string]string{}
	for _, id := range []string{"s1", "s2"} {
		httpPort := freePort(t)
		start(t, id, nil, "server", "--instance-id", id, "--http-port", itoa(httpPort), "--port", itoa(freePort(t)),
			"--l1-size-gb", "0.0625", "--chunk-size", itoa(chunkSize), "--l2-adapter", string(adapter),
			"--register-model", layout, "--coordinator-url", coordURL, "--coordinator-advertise-ip", "127.0.0.1",
			"--coordinator-heartbeat-interval", "0.5", "--coordinator-event-reporting", "--coordinator-event-flush-interval", "0.2")
		servers[id] = "http://127.0.0.1:" + itoa(httpPort)
		waitFor(t, id+" healthcheck", healthy(servers[id]+"/healthcheck"))
	}
	registered := func() bool {
		var got struct {
			Instances []struct {
				InstanceID string `json:"instance_id"`
			} `json:"instances"`
		}
		call(t, "GET", coordURL+"/instances", nil, nil, &got)
		return len(got.Instances) == 2
	}
	waitFor(t, "both servers registered", registered)

	usage := func() int64 {
		var q quotaView
		if code, _ := call(t, "GET", coordURL+"/quota/"+salt, nil, nil, &q); code != http.StatusOK {
			t.Fatalf("GET /quota/%s: %d", salt, code)
		}
		return gbToBytes(q.UsageGB)
	}
	bucketNames := func() map[string]bool {
		out := map[string]bool{}
		for _, k := range s3.Keys(t, s3.Bucket) {
			out[k] = true
		}
		return out
	}

	// Prime three prompts of 8 chunks through server s1's bytes API.
	prompts := [][]int64{tokens(0), tokens(1000), tokens(2000)}
	for i, p := range prompts {
		body := bytes.Repeat([]byte{byte(i + 1)}, 8*objectBytes)
		hdr := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(p), "X-LMCache-Cache-Salt": salt}
		var res struct {
			Stored int `json:"stored"`
		}
		if code, _ := call(t, "POST", servers["s1"]+"/api/kv/store", body, hdr, &res); code != http.StatusOK || res.Stored != 8 {
			t.Fatalf("store prompt %d: %d %+v", i, code, res)
		}
	}
	const total = 24 * objectBytes
	waitFor(t, "all 24 objects in the bucket", func() bool { return len(bucketNames()) == 24 })
	waitFor(t, "coordinator usage of 24 objects", func() bool { return usage() == total })

	// Pin prompt 0, then give the salt a quota below what is stored.
	pinned := s3Names(t, prompts[0])
	var pin map[string]any
	if code, _ := call(t, "POST", coordURL+"/cache/pins", map[string]any{
		"model_name": model, "world_size": 1, "token_ids": prompts[0], "cache_salt": salt}, nil, &pin); code != http.StatusOK {
		t.Fatalf("pin: %d %v", code, pin)
	}
	if pin["affected"] != float64(8) {
		t.Fatalf("pin reply %v, want 8 keys affected", pin)
	}
	const limit = 100000 // bytes: room for 12 of the 24 objects
	if code, _ := call(t, "PUT", coordURL+"/quota/"+salt, map[string]any{"limit_gb": float64(limit) / (1 << 30)}, nil, nil); code != http.StatusOK {
		t.Fatalf("PUT quota: %d", code)
	}

	// The coordinator evicts through DELETE /cache/objects on a server; the
	// delete events bring its usage under the limit and the bucket matches.
	waitFor(t, "usage under the quota", func() bool { return usage() < limit })
	waitFor(t, "bucket and coordinator agree", func() bool { return int64(len(bucketNames()))*objectBytes == usage() })
	names := bucketNames()
	if len(names) >= 24 || len(names) < len(pinned) {
		t.Fatalf("bucket holds %d objects after eviction", len(names))
	}
	for _, n := range pinned {
		if !names[n] {
			t.Errorf("pinned object %s was evicted", n)
		}
	}

	// A restarted coordinator resyncs usage from the servers' bucket listing.
	coord.Stop(t)
	startCoordinator("coordinator-restarted")
	waitFor(t, "servers re-registered", registered)
	wantBytes := int64(len(names)) * objectBytes
	waitFor(t, "resynced usage", func() bool { return usage() == wantBytes })

	// Without warming, s2 finds prompt 0 only in L2.
	hdr := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(prompts[0]), "X-LMCache-Cache-Salt": salt}
	var look struct {
		HitChunks int `json:"hit_chunks"`
		L1Keys    int `json:"l1_keys"`
		L2Keys    int `json:"l2_keys"`
	}
	call(t, "POST", servers["s2"]+"/api/kv/lookup", nil, hdr, &look)
	if look.HitChunks != 8 || look.L1Keys != 0 || look.L2Keys != 8 {
		t.Fatalf("cold lookup on s2 = %+v, want 8 chunks from L2", look)
	}

	// A warm prefetch through the coordinator retains prompt 0 in s2's L1.
	var sub struct {
		RequestID string `json:"request_id"`
		Chunks    int    `json:"chunks"`
		Status    string `json:"status"`
	}
	if code, _ := call(t, "POST", coordURL+"/cache/prefetches", map[string]any{
		"instance_id": "s2", "model_name": model, "world_size": 1, "token_ids": prompts[0], "cache_salt": salt}, nil, &sub); code != http.StatusOK || sub.Chunks != 8 || sub.RequestID == "" {
		t.Fatalf("warm prefetch submit: %d %+v", code, sub)
	}
	var poll struct {
		Status    string `json:"status"`
		FoundKeys int    `json:"found_keys"`
	}
	waitFor(t, "warm prefetch completion", func() bool {
		code, _ := call(t, "GET", coordURL+"/cache/prefetches/s2/"+sub.RequestID, nil, nil, &poll)
		return code == http.StatusOK && poll.Status == "completed"
	})
	if poll.FoundKeys != 8 {
		t.Errorf("warm prefetch found %d keys, want 8", poll.FoundKeys)
	}
	look.L1Keys, look.L2Keys = 0, 0
	call(t, "POST", servers["s2"]+"/api/kv/lookup", nil, hdr, &look)
	if look.HitChunks != 8 || look.L1Keys != 8 || look.L2Keys != 0 {
		t.Fatalf("lookup on s2 after warm prefetch = %+v, want 8 chunks from L1", look)
	}
	// The retrieved bytes are what s1 stored.
	req, _ := http.NewRequest("POST", servers["s2"]+"/api/kv/retrieve", nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := new(bytes.Buffer)
	_, _ = got.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got.Bytes(), bytes.Repeat([]byte{1}, 8*objectBytes)) {
		t.Fatalf("retrieve on s2: %d, %d bytes", resp.StatusCode, got.Len())
	}
}
