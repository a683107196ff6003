package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lmcache-go/lmcache/internal/coordload"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/proctest"
)

// BenchmarkWarmRestart measures a process-level warm restart: a real
// `lmcache coordinator --event-transport kafka --checkpoint-path` against
// a kfake cluster in the test process. It loads N keys through the topic,
// then restarts the coordinator three ways and times each from process
// start to its ledger equal to the reference computed from the stream
// (tracked keys and bytes, Kafka lag 0; then usage per salt, exactly):
//
//   - sigterm: a clean stop writes the checkpoint; a tail (N/10 new
//     stores, N/20 deletes) is published while it is down; the restart
//     loads the checkpoint and replays the tail.
//   - sigkill: the warm process applies a second tail and is killed with
//     SIGKILL before any further checkpoint; the restart loads the clean
//     stop's checkpoint and replays both tails (and first waits for the
//     dead consumer's group session to expire, as any Kafka consumer does).
//   - replay: the checkpoint is removed and the consumer group is a new
//     one; the restart replays the whole topic from its earliest record
//     (the baseline without a checkpoint).
//
// Figures are logged and reported (no timing assertions). Run:
//
//	go test -v -run '^$' -bench 'BenchmarkWarmRestart/keys=1000000$' -benchtime 1x -timeout 30m ./internal/e2e/
func BenchmarkWarmRestart(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000, 10_000_000} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				warmRestart(b, n)
			}
		})
	}
}

// restartStream is the benchmark's event stream and its reference: keys
// [0, next) were stored, keys [0, deleted) deleted again; every key has
// the same size and salt k mod salts.
type restartStream struct {
	sink          *kafkaevents.Sink
	cfg           coordload.KafkaConfig
	seqs          map[string]int64
	next, deleted int
}

// publish sends n keys from first as store (or delete) batches of
// coordload.CacheBatches' shape, continuing every instance's seq, in
// chunks so the test process never holds the whole stream.
func (s *restartStream) publish(tb testing.TB, first, n int, typ string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const chunk = 200_000
	for off := 0; off < n; off += chunk {
		cfg := s.cfg
		cfg.Offset, cfg.Keys = first+off, min(chunk, n-off)
		batches := coordload.CacheBatches(cfg)
		for i := range batches {
			bt := &batches[i]
			// The instance that stored a key also reports its delete, so
			// both are on one partition, in order, as the Fleet does (a
			// delete on another partition may be read before the store in
			// a replay). Ranges start at multiples of Batch, so batch i
			// holds keys of one storer.
			bt.InstanceID = coordload.InstanceName((cfg.Offset/cfg.Batch + i) % cfg.Instances)
			s.seqs[bt.InstanceID]++
			bt.Seq, bt.EventType = s.seqs[bt.InstanceID], typ
			if typ == kafkaevents.EventDelete {
				for j := range bt.Entries {
					bt.Entries[j].SizeBytes = 0
				}
			}
			if i > 0 && i%64 == 0 {
				if err := s.sink.Flush(ctx); err != nil {
					tb.Fatal(err)
				}
			}
			if err := s.sink.Publish(ctx, batches[i:i+1]); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := s.sink.Flush(ctx); err != nil {
		tb.Fatal(err)
	}
	if d := s.sink.DroppedBatches(); d != 0 {
		tb.Fatalf("%d batches dropped", d)
	}
}

func (s *restartStream) store(tb testing.TB, n int) {
	s.publish(tb, s.next, n, kafkaevents.EventStore)
	s.next += n
}

func (s *restartStream) del(tb testing.TB, n int) {
	s.publish(tb, s.deleted, n, kafkaevents.EventDelete)
	s.deleted += n
}

// want is the reference ledger: keys, bytes and bytes per salt.
func (s *restartStream) want() (keys, bytes int64, salts map[string]int64) {
	salts = map[string]int64{}
	for k := s.deleted; k < s.next; k++ {
		salts[coordload.SaltName(k%s.cfg.Salts)] += s.cfg.Bytes
	}
	keys = int64(s.next - s.deleted)
	return keys, keys * s.cfg.Bytes, salts
}

// benchCoord is one coordinator process (SIGKILL allowed).
type benchCoord struct {
	cmd   *exec.Cmd
	log   string
	done  chan struct{}
	start time.Time
}

func startBenchCoord(tb testing.TB, args []string) *benchCoord {
	tb.Helper()
	bin, _ := proctest.Binary(tb)
	c := &benchCoord{log: filepath.Join(tb.TempDir(), "coordinator.log"), done: make(chan struct{})}
	f, err := os.Create(c.log)
	if err != nil {
		tb.Fatal(err)
	}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Env = append(os.Environ(), "LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=0")
	c.cmd.Stdout, c.cmd.Stderr = f, f
	c.start = time.Now()
	if err := c.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = c.cmd.Wait(); f.Close(); close(c.done) }() // ends when the process exits
	tb.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if tb.Failed() {
			raw, _ := os.ReadFile(c.log)
			tb.Logf("--- coordinator log ---\n%s", tail(raw, 6000))
		}
	})
	return c
}

// stop sends sig and waits for the exit (status 0 after SIGTERM).
func (c *benchCoord) stop(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(2 * time.Minute):
		tb.Fatalf("coordinator did not exit within 2 min of %v", sig)
	}
	if sig == syscall.SIGTERM && c.cmd.ProcessState.ExitCode() != 0 {
		tb.Fatalf("coordinator exit %v after SIGTERM", c.cmd.ProcessState)
	}
}

var restoredTook = regexp.MustCompile(`msg="checkpoint restored".* keys=(\d+) .*took=(\S+)`)

// restored is the "checkpoint restored" log line's key count and load
// time ("" when it restored none).
func (c *benchCoord) restored(tb testing.TB) string {
	raw, err := os.ReadFile(c.log)
	if err != nil {
		tb.Fatal(err)
	}
	if m := restoredTook.FindSubmatch(raw); m != nil {
		return fmt.Sprintf("%s keys in %s", m[1], m[2])
	}
	return "none"
}

// benchMetrics scrapes unlabelled samples.
func benchMetrics(url string, names ...string) []float64 {
	out := make([]float64, len(names))
	for i := range out {
		out[i] = math.NaN()
	}
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		for i, n := range names {
			if v, ok := strings.CutPrefix(line, n+" "); ok {
				out[i], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return out
}

// untilEqual polls url until its ledger equals the stream's reference
// and returns the time since the process started; then it checks usage
// per salt exactly.
func untilEqual(tb testing.TB, c *benchCoord, url string, s *restartStream) (healthy, equal time.Duration) {
	tb.Helper()
	keys, bytes, salts := s.want()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		select {
		case <-c.done:
			tb.Fatal("coordinator exited")
		default:
		}
		if healthy == 0 {
			if resp, err := client.Get(url + "/healthz"); err == nil {
				resp.Body.Close()
				healthy = time.Since(c.start)
			}
		} else {
			m := benchMetrics(url, "lmcache_coordinator_tracked_keys", "lmcache_coordinator_tracked_bytes", "lmcache_coordinator_kafka_lag")
			if m[0] == float64(keys) && m[1] == float64(bytes) && m[2] == 0 {
				equal = time.Since(c.start)
				break
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("ledger never equalled the reference (%d keys, %d bytes)", keys, bytes)
		}
		time.Sleep(10 * time.Millisecond) // polling interval (the measurement's resolution)
	}
	var usage struct {
		BySalt []struct {
			Salt    string  `json:"cache_salt"`
			UsageGB float64 `json:"usage_gb"`
		} `json:"by_cache_salt"`
	}
	resp, err := http.Get(url + "/quota")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&usage); err != nil {
		tb.Fatal(err)
	}
	if len(usage.BySalt) != len(salts) {
		tb.Fatalf("%d salts, want %d", len(usage.BySalt), len(salts))
	}
	for _, r := range usage.BySalt {
		if got := int64(math.Round(r.UsageGB * (1 << 30))); got != salts[r.Salt] {
			tb.Fatalf("salt %s: %d bytes, want %d", r.Salt, got, salts[r.Salt])
		}
	}
	return healthy, equal
}

func loadAvg() string {
	raw, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func warmRestart(b *testing.B, n int) {
	b.StopTimer()
	b.Logf("load average at start: %s", loadAvg())
	const topic = "warm-restart"
	cl, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(8, topic))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	brokers := strings.Join(cl.ListenAddrs(), ",")
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: cl.ListenAddrs(), Topic: topic, DeliveryTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	s := &restartStream{sink: sink, seqs: map[string]int64{},
		cfg: coordload.KafkaConfig{Brokers: cl.ListenAddrs(), Topic: topic, Batch: 1000, Salts: 100, Instances: 20, Bytes: 2 << 20}}
	ckpt := filepath.Join(b.TempDir(), "coordinator.ckpt")
	port := proctest.FreePort(b)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	args := kafkaCoordinatorArgs(port, brokers, topic, "warm-restart", "--eviction-check-interval", "0",
		"--checkpoint-path", ckpt, "--checkpoint-interval", "0")

	first := startBenchCoord(b, args)
	loadStart := time.Now()
	s.store(b, n)
	published := time.Since(loadStart)
	_, _ = untilEqual(b, first, url, s)
	b.Logf("load: %d keys published in %v, applied %v after the first publish", n, published.Round(time.Millisecond), time.Since(loadStart).Round(time.Millisecond))
	stopAt := time.Now()
	first.stop(b, syscall.SIGTERM)
	st, _ := os.Stat(ckpt)
	b.Logf("clean stop with the checkpoint: %v, %d bytes", time.Since(stopAt).Round(time.Millisecond), st.Size())

	// sigterm: checkpoint + a tail published while down.
	s.store(b, n/10)
	s.del(b, n/20)
	warm := startBenchCoord(b, args)
	h1, e1 := untilEqual(b, warm, url, s)
	k1, _, _ := s.want()
	b.Logf("sigterm restart: healthy %v, ledger equal %v (%d keys; checkpoint: %s; tail replayed: %d stores, %d deletes)",
		h1.Round(time.Millisecond), e1.Round(time.Millisecond), k1, warm.restored(b), n/10, n/20)

	// sigkill: a second tail applied by the warm process, then SIGKILL.
	s.store(b, n/10)
	s.del(b, n/20)
	_, _ = untilEqual(b, warm, url, s)
	warm.stop(b, syscall.SIGKILL)
	killed := startBenchCoord(b, args)
	h2, e2 := untilEqual(b, killed, url, s)
	k2, _, _ := s.want()
	b.Logf("sigkill restart: healthy %v, ledger equal %v (%d keys; checkpoint: %s; replayed both tails: %d stores, %d deletes; includes the dead member's group session timeout)",
		h2.Round(time.Millisecond), e2.Round(time.Millisecond), k2, killed.restored(b), n/5, n/10)
	killed.stop(b, syscall.SIGTERM)

	// replay: no checkpoint and a new consumer group (the old one's
	// commit is at the end), so the whole topic from its earliest record.
	if err := os.Remove(ckpt); err != nil {
		b.Fatal(err)
	}
	cold := startBenchCoord(b, kafkaCoordinatorArgs(port, brokers, topic, "warm-restart-replay", "--eviction-check-interval", "0",
		"--checkpoint-path", ckpt, "--checkpoint-interval", "0"))
	h3, e3 := untilEqual(b, cold, url, s)
	b.Logf("replay without a checkpoint: healthy %v, ledger equal %v (%d keys from %d events)",
		h3.Round(time.Millisecond), e3.Round(time.Millisecond), k2, n+n/5+n/10)
	cold.stop(b, syscall.SIGTERM)
	b.Logf("sigterm warm / full replay: x%.3f; sigkill warm / full replay: x%.3f; load average at end: %s",
		e1.Seconds()/e3.Seconds(), e2.Seconds()/e3.Seconds(), loadAvg())
	b.ReportMetric(e1.Seconds(), "sigterm_s")
	b.ReportMetric(e2.Seconds(), "sigkill_s")
	b.ReportMetric(e3.Seconds(), "replay_s")
	b.ReportMetric(0, "ns/op")
}
