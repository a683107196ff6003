package coordload

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/coordtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type usage struct {
	TotalGB float64 `json:"total_gb"`
	BySalt  []struct {
		Salt    string  `json:"cache_salt"`
		UsageGB float64 `json:"usage_gb"`
	} `json:"by_cache_salt"`
}

func getUsage(t *testing.T, c *http.Client, url string) usage {
	t.Helper()
	resp, err := c.Get(url + "/quota")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u usage
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestRunAgainstCoordinator drives a real coordinator over loopback: every
// key arrives exactly once (1 GiB each, so usage in GiB counts keys), per
// salt as key i mod salts, a rerun of the same keys changes nothing, and
// an offset run adds new ones.
func TestRunAgainstCoordinator(t *testing.T) {
	url := coordtest.Start(t, nil, nil)
	client := NewClient(3)
	defer client.CloseIdleConnections()
	cfg := Config{URL: url, Keys: 5003, Batch: 100, Concurrency: 3, Salts: 5, Instances: 7, Bytes: 1 << 30, Timeout: DefaultConfig().Timeout}
	res, err := Run(context.Background(), cfg, client)
	if err != nil {
		t.Fatal(err)
	}
	if res.Events != 5003 || res.Requests != 51 || res.Max < res.P99 || res.P99 < res.P50 || res.P50 <= 0 {
		t.Fatalf("result %+v, want 5003 events in 51 requests with max >= p99 >= p50 > 0", res)
	}
	u := getUsage(t, client, url)
	if u.TotalGB != 5003 || len(u.BySalt) != 5 {
		t.Fatalf("usage %+v, want 5003 GiB over 5 salts", u)
	}
	for _, s := range u.BySalt {
		// Keys 0..5002: salts 0-2 get 1001 keys, salts 3-4 get 1000.
		want := 1000.0
		if s.Salt < SaltName(3) {
			want = 1001
		}
		if s.UsageGB != want {
			t.Fatalf("salt %s: %v GiB, want %v", s.Salt, s.UsageGB, want)
		}
	}
	if _, err := Run(context.Background(), cfg, client); err != nil {
		t.Fatal(err)
	}
	if u := getUsage(t, client, url); u.TotalGB != 5003 {
		t.Fatalf("after re-storing the same keys: %v GiB, want 5003", u.TotalGB)
	}
	cfg.Offset, cfg.Keys = 5003, 997
	if _, err := Run(context.Background(), cfg, client); err != nil {
		t.Fatal(err)
	}
	if u := getUsage(t, client, url); u.TotalGB != 6000 {
		t.Fatalf("after 997 more keys: %v GiB, want 6000", u.TotalGB)
	}
}

// TestRunStopsOnRejection: a refused batch or a wrong recorded count ends
// the run with an error naming the instance and seq; only accepted events
// are counted.
func TestRunStopsOnRejection(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		status      int
		want        string
	}{
		{"422", `{"detail":[]}`, http.StatusUnprocessableEntity, "status 422"},
		{"short count", `{"recorded":1}`, http.StatusOK, `want {"recorded": 10}`},
		{"not json", `ok`, http.StatusOK, `want {"recorded": 10}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bodies []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				bodies = append(bodies, string(b))
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.reply)
			}))
			defer srv.Close()
			client := NewClient(1)
			defer client.CloseIdleConnections()
			res, err := Run(context.Background(), Config{URL: srv.URL, Keys: 100, Batch: 10, Concurrency: 1, Salts: 1, Instances: 1, Timeout: DefaultConfig().Timeout}, client)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "mp-0 seq 1") {
				t.Fatalf("err %v, want one naming mp-0 seq 1 and %q", err, tc.want)
			}
			if res.Events != 0 || res.Requests != 0 || len(bodies) != 1 {
				t.Fatalf("result %+v after %d requests, want nothing counted after 1", res, len(bodies))
			}
			var b wireBatch
			if err := json.Unmarshal([]byte(bodies[0]), &b); err != nil || b.InstanceID != "mp-0" || b.Seq != 1 || b.Tier != "l2" || len(b.Events) != 10 ||
				b.Events[3].Type != "store" || b.Events[3].Key.ChunkHashHex != ChunkHash(3) || b.Events[3].Key.CacheSalt != "tenant-0" {
				t.Fatalf("body %s (%v)", bodies[0], err)
			}
		})
	}
}

// TestInstancesKeepTheirSeqOrder: with more instances than workers each
// instance is reported by one worker, so its seq numbers arrive 1, 2, 3...
func TestInstancesKeepTheirSeqOrder(t *testing.T) {
	type seen struct {
		inst string
		seq  int64
	}
	ch := make(chan seen, 200)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b wireBatch
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ch <- seen{b.InstanceID, b.Seq}
		_, _ = io.WriteString(w, `{"recorded":`+itoaTest(len(b.Events))+`}`)
	}))
	defer srv.Close()
	client := NewClient(4)
	defer client.CloseIdleConnections()
	res, err := Run(context.Background(), Config{URL: srv.URL, Keys: 1000, Batch: 10, Concurrency: 4, Salts: 3, Instances: 10, Timeout: DefaultConfig().Timeout}, client)
	if err != nil || res.Requests != 100 {
		t.Fatalf("%+v %v", res, err)
	}
	close(ch)
	last := map[string]int64{}
	total := 0
	for s := range ch {
		if s.seq != last[s.inst]+1 {
			t.Fatalf("instance %s: seq %d after %d", s.inst, s.seq, last[s.inst])
		}
		last[s.inst] = s.seq
		total++
	}
	if len(last) != 10 || total != 100 {
		t.Fatalf("%d instances, %d batches; want 10, 100", len(last), total)
	}
}

func itoaTest(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestParseFlags(t *testing.T) {
	c, err := ParseFlags([]string{"--url", "http://127.0.0.1:1", "--keys", "20000000", "--batch", "500", "--concurrency", "8", "--salts", "10", "--instances", "20", "--offset", "5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.URL, want.Keys, want.Batch, want.Concurrency, want.Salts, want.Instances, want.Offset = "http://127.0.0.1:1", 20_000_000, 500, 8, 10, 20, 5
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	for _, args := range [][]string{{"--keys", "0"}, {"--batch", "0"}, {"--concurrency", "0"}, {"--salts", "0"}, {"--instances", "0"}, {"--bytes", "-1"}, {"--timeout", "0s"}, {"--offset", "-1"}, {"--url", "127.0.0.1:9300"}, {"extra"}} {
		if _, err := ParseFlags(args, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestChunkHashDistinct: the key stream is distinct and well-formed.
func TestChunkHashDistinct(t *testing.T) {
	seen := make(map[string]bool, 200_000)
	for i := 0; i < 200_000; i++ {
		h := ChunkHash(i)
		if len(h) != 64 || seen[h] {
			t.Fatalf("key %d: %q (len %d, repeat %v)", i, h, len(h), seen[h])
		}
		seen[h] = true
	}
}

// TestSlowRequestsListed: with Slow at 1ns every request is listed once,
// by its first key, and with ServerPID (here this process, which serves
// the coordinator too) each carries the sampled counters; a ServerPID
// that names no process fails the run.
func TestSlowRequestsListed(t *testing.T) {
	url := coordtest.Start(t, nil, nil)
	client := NewClient(2)
	defer client.CloseIdleConnections()
	cfg := Config{URL: url, Keys: 200, Batch: 10, Concurrency: 2, Salts: 2, Instances: 2, Timeout: DefaultConfig().Timeout, Slow: time.Nanosecond, ServerPID: os.Getpid()}
	res, err := Run(context.Background(), cfg, client)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Slow) != 20 {
		t.Fatalf("%d slow requests, want all 20", len(res.Slow))
	}
	firsts := map[int]bool{}
	for _, s := range res.Slow {
		if s.Took <= 0 || s.Took > res.Max || s.Start < 0 || s.Start > res.Elapsed {
			t.Errorf("slow request %+v outside the run (max %v, elapsed %v)", s, res.Max, res.Elapsed)
		}
		firsts[s.FirstKey] = true
	}
	for k := 0; k < 200; k += 10 {
		if !firsts[k] {
			t.Errorf("no slow entry for the batch at key %d", k)
		}
	}
	if n := strings.Count(res.String(), "\nslow: "); n != 20 {
		t.Errorf("report lists %d slow requests, want 20", n)
	}

	cfg.Offset, cfg.ServerPID = 200, 1<<30 // above any pid_max
	if _, err := Run(context.Background(), cfg, client); err == nil || !strings.Contains(err.Error(), "schedstat of pid") {
		t.Fatalf("run with a missing server pid: %v", err)
	}
}

// TestSchedWaitCountsCPU: this process's schedstat CPU time grows with
// work done in between.
func TestSchedWaitCountsCPU(t *testing.T) {
	cpu1, _, err := schedWait(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(nil)
	for range 200_000 {
		sum = sha256.Sum256(sum[:])
	}
	cpu2, _, err := schedWait(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if cpu2 <= cpu1 || sum == [32]byte{} {
		t.Fatalf("CPU time %v then %v after 200,000 hashes", cpu1, cpu2)
	}
}

// TestMinorFaultsCounted: writing 64 fresh anonymous pages raises this
// process's minor-fault count by at least 64.
func TestMinorFaultsCounted(t *testing.T) {
	const pages = 64
	mem, err := syscall.Mmap(-1, 0, pages*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	before, err := minorFaults(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	after, err := minorFaults(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < pages {
		t.Fatalf("minor faults %d then %d after writing %d fresh pages", before, after, pages)
	}
	if _, err := minorFaults(1 << 30); err == nil {
		t.Fatal("minorFaults of a missing pid: no error")
	}
}

// TestParseCommand: the modes' flags and defaults, and their errors.
func TestParseCommand(t *testing.T) {
	c, err := ParseCommand([]string{"--mode", "fleet", "--url", "http://127.0.0.1:1", "--instances", "20", "--keys", "30000",
		"--kafka-brokers", "127.0.0.1:9092, 127.0.0.1:9093", "--pace", "100ms", "--hold", "2s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != ModeFleet || len(c.Targets) != 1 || c.Targets[0] != "http://127.0.0.1:1" || c.KeysPerInstance != 1500 ||
		len(c.Brokers) != 2 || c.Brokers[1] != "127.0.0.1:9093" || c.Topic != DefaultTopic || c.Pace != 100*time.Millisecond ||
		c.Hold != 2*time.Second || c.Window != 4 || c.Heartbeat != time.Second {
		t.Fatalf("fleet command %+v", c)
	}
	if c, err := ParseCommand(nil, io.Discard); err != nil || c.Mode != ModeHTTP || c.HTTP != DefaultConfig() {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for _, args := range [][]string{{"--mode", "grpc"}, {"--mode", "kafka"}, {"--mode", "kafka", "--kafka-brokers", "b:1", "--kafka-topic", ""},
		{"--mode", "fleet", "--targets", "127.0.0.1:1"}, {"--mode", "fleet", "--window", "0"}, {"--mode", "fleet", "--heartbeat", "0s"},
		{"--mode", "fleet", "--hold", "-1s"}, {"--mode", "fleet", "--keys-per-instance", "-1"}} {
		if _, err := ParseCommand(args, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
