package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// KafkaBrokersEnv, when set (comma-separated host:port), points the Kafka
// end-to-end tests at a real Kafka instead of franz-go's kfake cluster. No
// Kafka broker installs from the package sources here, so by default each
// test starts a kfake cluster in the test process, on real TCP sockets on
// 127.0.0.1, and the processes under test connect to it.
const KafkaBrokersEnv = "LMCACHE_TEST_KAFKA_BROKERS"

var kafkaTopicSeq atomic.Int64

// startKafka returns a broker list (comma-separated, for the processes'
// flags) and a fresh topic with the given partitions: a three-broker kfake
// cluster closed with the test, or the real Kafka in KafkaBrokersEnv (where
// the topic is created).
func startKafka(t *testing.T, partitions int32) (brokers, topic string) {
	t.Helper()
	topic = fmt.Sprintf("lmcache-e2e-%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano(), kafkaTopicSeq.Add(1))
	if env := os.Getenv(KafkaBrokersEnv); env != "" {
		createKafkaTopic(t, strings.Split(env, ","), topic, partitions)
		return env, topic
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return strings.Join(c.ListenAddrs(), ","), topic
}

func createKafkaTopic(t *testing.T, brokers []string, topic string, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, -1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic %s: %v %+v", topic, err, resp)
	}
}

// kafkaCoordinatorArgs are the flags of `lmcache coordinator
// --event-transport kafka` on 127.0.0.1:port; extra flags follow.
func kafkaCoordinatorArgs(port int, brokers, topic, group string, extra ...string) []string {
	return append([]string{"coordinator", "--host", "127.0.0.1", "--port", itoa(port), "--chunk-size", itoa(chunkSize),
		"--event-transport", "kafka", "--kafka-bootstrap-servers", brokers, "--kafka-topic", topic, "--kafka-group-id", group,
		"--health-check-interval", "1"}, extra...)
}

// startKafkaCoordinator starts a kafka-mode coordinator (startup resync
// off) and waits for /healthz.
func startKafkaCoordinator(t *testing.T, name string, port int, brokers, topic, group string, extra ...string) (*proc, string) {
	t.Helper()
	p := start(t, name, []string{"LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=false"}, kafkaCoordinatorArgs(port, brokers, topic, group, extra...)...)
	url := "http://127.0.0.1:" + itoa(port)
	waitFor(t, name+" healthz", healthy(url+"/healthz"))
	return p, url
}

// startKafkaServer starts an `lmcache server` (fs L2 in dir) registered
// with coordURL and publishing its cache events to the topic.
func startKafkaServer(t *testing.T, id, coordURL, dir, brokers, topic string) (*proc, string) {
	t.Helper()
	adapter, _ := json.Marshal(map[string]any{"type": "fs", "base_path": dir})
	layout := fmt.Sprintf(`{"model_name":%q,"world_size":1,"num_layers":2,"hidden_size":64,"dtype":"float16","object_bytes":%d}`, model, objectBytes)
	httpPort := freePort(t)
	url := "http://127.0.0.1:" + itoa(httpPort)
	p := start(t, id, nil, "server", "--instance-id", id, "--http-port", itoa(httpPort), "--port", itoa(freePort(t)),
		"--l1-size-gb", "0.0625", "--chunk-size", itoa(chunkSize), "--l2-adapter", string(adapter),
		"--register-model", layout, "--coordinator-url", coordURL, "--coordinator-advertise-ip", "127.0.0.1",
		"--coordinator-heartbeat-interval", "0.5", "--coordinator-event-reporting", "--coordinator-event-flush-interval", "0.2",
		"--coordinator-event-transport", "kafka", "--coordinator-kafka-bootstrap-servers", brokers, "--coordinator-kafka-topic", topic)
	waitFor(t, id+" healthcheck", healthy(url+"/healthcheck"))
	return p, url
}

// saltUsage is GET /quota/{salt}'s usage in bytes.
func saltUsage(t *testing.T, coordURL, s string) int64 {
	t.Helper()
	var q quotaView
	if code, _ := call(t, "GET", coordURL+"/quota/"+s, nil, nil, &q); code != http.StatusOK {
		t.Fatalf("GET /quota/%s: %d", s, code)
	}
	return gbToBytes(q.UsageGB)
}

// metricValue is the value of one unlabelled series ("" when absent).
func metricValue(text, name string) string {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// TestKafkaFleetUsageAndEviction runs a kfake cluster in the test process,
// `lmcache coordinator --event-transport kafka` and `lmcache server
// --coordinator-event-transport kafka` (fs L2) as processes. Stores through
// the server's HTTP API reach the coordinator through the topic (usage
// equals what was stored); POST /events answers 404 in kafka mode; a quota
// below the usage makes the coordinator evict through DELETE /cache/objects
// on the server, whose delete events come back through Kafka and bring the
// usage under the quota, matching the files left in the adapter.
func TestKafkaFleetUsageAndEviction(t *testing.T) {
	brokers, topic := startKafka(t, 3)
	coordPort := freePort(t)
	coord, coordURL := startKafkaCoordinator(t, "coordinator", coordPort, brokers, topic, "coord-1", "--eviction-check-interval", "0.5")
	defer coord.Stop(t)
	dir := t.TempDir()
	srv, server := startKafkaServer(t, "kmp1", coordURL, dir, brokers, topic)
	defer srv.Stop(t)

	for i := 0; i < 3; i++ {
		storeChunks(t, server, 1000*i)
	}
	const total = 24 * objectBytes
	waitFor(t, "usage of 24 objects through Kafka", func() bool { return saltUsage(t, coordURL, salt) == total })
	if code, _ := call(t, "POST", coordURL+"/events", map[string]any{"batches": []any{}}, nil, nil); code != http.StatusNotFound {
		t.Errorf("POST /events in kafka mode: %d, want 404", code)
	}
	m := metricsText(t, coordURL)
	if v := metricValue(m, "lmcache_coordinator_kafka_records_applied_total"); v == "" || v == "0" {
		t.Errorf("kafka_records_applied_total = %q, want > 0", v)
	}
	if v := metricValue(m, "lmcache_coordinator_kafka_records_rejected_total"); v != "0" {
		t.Errorf("kafka_records_rejected_total = %q, want 0", v)
	}

	const limit = 100000 // bytes: room for 12 of the 24 objects
	if code, _ := call(t, "PUT", coordURL+"/quota/"+salt, map[string]any{"limit_gb": float64(limit) / (1 << 30)}, nil, nil); code != http.StatusOK {
		t.Fatalf("PUT quota: %d", code)
	}
	files := func() int64 {
		n := int64(0)
		_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				n++
			}
			return nil
		})
		return n
	}
	waitFor(t, "usage under the quota after eviction", func() bool { return saltUsage(t, coordURL, salt) < limit })
	waitFor(t, "adapter and coordinator agree", func() bool { return files()*objectBytes == saltUsage(t, coordURL, salt) })
	if n := files(); n >= 24 || n == 0 {
		t.Fatalf("adapter holds %d objects after eviction", n)
	}
}

// upstreamBatch is one CacheEventBatch as upstream's pydantic model dumps
// it (every field, declaration order): a store of one key per size.
func upstreamBatch(instance string, seq int, hashes []string, size int) map[string]any {
	entries := []any{}
	for _, h := range hashes {
		entries = append(entries, map[string]any{
			"key":          map[string]any{"chunk_hash_hex": h, "model_name": model, "kv_rank": 0, "object_group_id": 0, "cache_salt": salt},
			"size_bytes":   size,
			"token_ids":    []any{},
			"token_offset": -1,
		})
	}
	return map[string]any{"instance_id": instance, "incarnation": 1, "seq": seq, "event_type": "store", "tier": "l2",
		"backend": "fs", "entries": entries, "shared": false, "ts": 1767225600.0, "capacity_bytes": 0, "capacity_revision": 0}
}

// TestKafkaMixedProducers: our `lmcache server` and a producer writing
// upstream's record format (testdata/upstream_client.py in
// internal/kafkaevents, on librdkafka, upstream's client, with upstream's
// producer settings) share one topic; one kafka-mode coordinator applies
// both streams: usage is the sum.
func TestKafkaMixedProducers(t *testing.T) {
	// Debian's interpreter, which has python3-confluent-kafka
	// (scripts/install-deps.sh test); the first python3 on PATH may be
	// another.
	const python = "/usr/bin/python3"
	brokers, topic := startKafka(t, 3)
	coordPort := freePort(t)
	coord, coordURL := startKafkaCoordinator(t, "coordinator", coordPort, brokers, topic, "coord-mixed", "--eviction-check-interval", "0")
	defer coord.Stop(t)
	srv, server := startKafkaServer(t, "kmp-go", coordURL, t.TempDir(), brokers, topic)
	defer srv.Stop(t)
	storeChunks(t, server, 0)

	// The upstream-format producer: 5 batches of 2 keys of 1000 bytes.
	var lines strings.Builder
	for seq := 1; seq <= 5; seq++ {
		hashes := []string{fmt.Sprintf("%063x%d", seq, 1), fmt.Sprintf("%063x%d", seq, 2)}
		line, _ := json.Marshal(map[string]any{"key": "py-mp", "batch": upstreamBatch("py-mp", seq, hashes, 1000)})
		lines.Write(line)
		lines.WriteByte('\n')
	}
	cmd := exec.Command(python, filepath.Join("..", "kafkaevents", "testdata", "upstream_client.py"), "produce", brokers, topic)
	cmd.Stdin = strings.NewReader(lines.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("upstream_client.py produce: %v\n%s", err, out)
	}
	const want = 8*objectBytes + 10*1000
	waitFor(t, "usage of both producers", func() bool { return saltUsage(t, coordURL, salt) == want })
	if v := metricValue(metricsText(t, coordURL), "lmcache_coordinator_kafka_records_undecodable_total"); v != "0" {
		t.Errorf("undecodable records = %q, want 0", v)
	}
}
