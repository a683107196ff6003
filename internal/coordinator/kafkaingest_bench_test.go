package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/registry"
	"github.com/lmcache-go/lmcache/internal/coordload"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// benchKeys reads a key count from the environment (for the 1M/10M runs in
// BENCHMARKS.md) or uses def.
func benchKeys(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func benchLoad(keys int) coordload.KafkaConfig {
	return coordload.KafkaConfig{Keys: keys, Batch: 1000, Salts: 100, Instances: 20, Bytes: 2 << 20}
}

// trackedKeys polls the ledger size through GET /metrics until it reaches
// want or the deadline passes.
func waitTracked(b *testing.B, c *coord, want int) {
	b.Helper()
	line := fmt.Sprintf("lmcache_coordinator_tracked_keys %d\n", want)
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		if _, raw := c.do("GET", "/metrics", nil); strings.Contains(string(raw), line) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("ledger never reached %d keys", want)
}

// BenchmarkKafkaVsHTTPIngest measures end-to-end ingest of the same store
// batches (1,000 keys each, 20 instances) into a coordinator: posted to POST
// /events over loopback HTTP by 4 workers (each instance's batches in order),
// against published to a kfake cluster in this process (8 partitions)
// through the MP server's Sink and consumed by a kafka-mode coordinator,
// until its ledger holds every key. KAFKA_BENCH_KEYS sets the key count.
func BenchmarkKafkaVsHTTPIngest(b *testing.B) {
	keys := benchKeys("KAFKA_BENCH_KEYS", 200_000)
	load := benchLoad(keys)
	batches := coordload.CacheBatches(load)
	bodies := make([][]byte, len(batches))
	for i, bt := range batches {
		v, err := kafkaevents.Encode(bt)
		if err != nil {
			b.Fatal(err)
		}
		bodies[i] = v
	}
	var httpRate float64
	b.Run("http_events", func(b *testing.B) {
		for range b.N {
			c := startCoord(b, nil)
			began := time.Now()
			const workers = 4
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range bodies {
						// Instance i%20 belongs to worker (i%20)%workers: its
						// batches go out in seq order.
						if (i%load.Instances)%workers != w {
							continue
						}
						resp, err := c.client.Post(c.base+"/events", "application/json", strings.NewReader(string(bodies[i])))
						if err != nil {
							errs <- err
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							errs <- fmt.Errorf("POST /events: %d", resp.StatusCode)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			waitTracked(b, c, keys)
			httpRate = float64(keys) / time.Since(began).Seconds()
			b.ReportMetric(httpRate, "events/s")
		}
	})
	b.Run("kafka", func(b *testing.B) {
		for range b.N {
			topic := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 10)
			cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, topic))
			if err != nil {
				b.Fatal(err)
			}
			c := startCoord(b, func(cfg *config.Config) {
				cfg.Ingest.EventTransport = config.TransportKafka
				cfg.Ingest.KafkaBootstrapServers = strings.Join(cl.ListenAddrs(), ",")
				cfg.Ingest.KafkaTopic = topic
			})
			kl := load
			kl.Brokers, kl.Topic = cl.ListenAddrs(), topic
			began := time.Now()
			published, err := coordload.PublishKafka(context.Background(), kl, batches)
			if err != nil {
				b.Fatal(err)
			}
			waitTracked(b, c, keys)
			rate := float64(keys) / time.Since(began).Seconds()
			b.ReportMetric(rate, "events/s")
			b.ReportMetric(float64(keys)/published.Seconds(), "published_events/s")
			if httpRate > 0 {
				b.ReportMetric(rate/httpRate, "x_http")
			}
			c.stop()
			_ = c.wait()
			cl.Close()
		}
	})
}

// mpListing serves GET /cache/objects pages of keys (the resync source).
func mpListing(b *testing.B, batches []kafkaevents.Batch) *httptest.Server {
	type entry struct {
		Key       any   `json:"key"`
		SizeBytes int64 `json:"size_bytes"`
	}
	var all []entry
	for _, bt := range batches {
		for _, e := range bt.Entries {
			all = append(all, entry{Key: e.Key, SizeBytes: e.SizeBytes})
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size, _ := strconv.Atoi(r.URL.Query().Get("page_size"))
		from, _ := strconv.Atoi(r.URL.Query().Get("page_token"))
		to := min(from+size, len(all))
		out := map[string]any{"entries": all[from:to], "next_page_token": nil}
		if to < len(all) {
			out["next_page_token"] = strconv.Itoa(to)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkWarmRestartVsResync: for one ledger of RESTART_BENCH_KEYS keys
// (default 1M), the time a coordinator takes to come back warm from its
// checkpoint (New with --checkpoint-path: read, verify, rebuild the ledger
// and gate), against the time a startup resync takes to page the same keys
// from an MP server's GET /cache/objects (5,000 per page, the MP maximum).
func BenchmarkWarmRestartVsResync(b *testing.B) {
	keys := benchKeys("RESTART_BENCH_KEYS", 1_000_000)
	batches := coordload.CacheBatches(benchLoad(keys))
	path := filepath.Join(b.TempDir(), "coord.ckpt")
	cfg := testConfig()
	cfg.Ingest.CheckpointPath, cfg.Ingest.CheckpointInterval = path, 0
	src, err := coordinator.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, bt := range batches {
		body, _ := json.Marshal(map[string]any{"batches": []kafkaevents.Batch{bt}})
		if _, _, _, err := src.IngestCacheEvents(body); err != nil {
			b.Fatal(err)
		}
	}
	began := time.Now()
	if err := src.SaveCheckpoint(); err != nil {
		b.Fatal(err)
	}
	saveTook := time.Since(began)
	fi, _ := os.Stat(path)
	listing := mpListing(b, batches)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(listing.URL, "http://"))
	p, _ := strconv.Atoi(port)
	var warm, resync time.Duration
	for range b.N {
		began := time.Now()
		restored, err := coordinator.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		warm = time.Since(began)
		_ = restored

		rcfg := testConfig()
		rcfg.ResyncPageSize = config.MaxResyncPageSize
		cold, err := coordinator.New(rcfg)
		if err != nil {
			b.Fatal(err)
		}
		began = time.Now()
		if n := cold.ResyncFrom(context.Background(), registry.Instance{InstanceID: "mp", IP: host, HTTPPort: p}); n != keys {
			b.Fatalf("resync recorded %d keys, want %d", n, keys)
		}
		resync = time.Since(began)
	}
	b.ReportMetric(warm.Seconds(), "warm_s")
	b.ReportMetric(resync.Seconds(), "resync_s")
	b.ReportMetric(resync.Seconds()/warm.Seconds(), "x_faster")
	b.ReportMetric(saveTook.Seconds(), "save_s")
	b.ReportMetric(float64(fi.Size())/float64(keys), "bytes/key")
}
