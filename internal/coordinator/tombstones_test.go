package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// tsBase is the event time of these tests (2026-01-01T00:00:00Z).
const tsBase = 1767225600.0

// tombCoord runs a coordinator (loops off) on a loopback listener until the
// test ends and returns it with its base URL.
func tombCoord(t *testing.T, mutate func(*config.Config)) (*Server, string) {
	t.Helper()
	cfg := config.Default()
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.HealthCheckInterval, cfg.EvictionCheckInterval, cfg.EnableStartupResync = 0, 0, false
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s, "http://" + ln.Addr().String()
}

func tombKey(hash string) objkey.Encoded {
	return objkey.Encoded{ChunkHashHex: hash, ModelName: "m", KVRank: 0, CacheSalt: "a"}
}

// tombBatch is an L2 batch of salt a with every field present (the fast
// decoder's shape), one entry per (hash, size) pair.
func tombBatch(instance string, seq int64, typ string, ts float64, pairs ...any) kafkaevents.Batch {
	b := kafkaevents.Batch{InstanceID: instance, Incarnation: 1, Seq: seq, EventType: typ, Tier: kafkaevents.TierL2,
		Backend: "s3", Shared: true, TS: kafkaevents.PyFloat(ts), Entries: []kafkaevents.Entry{}}
	for i := 0; i+1 < len(pairs); i += 2 {
		b.Entries = append(b.Entries, kafkaevents.Entry{Key: tombKey(pairs[i].(string)), SizeBytes: int64(pairs[i+1].(int)),
			TokenIDs: []int64{}, TokenOffset: kafkaevents.UnknownTokenOffset})
	}
	return b
}

// postRaw posts body to path and checks the status.
func postRaw(t *testing.T, base, path string, body []byte, want int) string {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("POST %s: %d %s, want %d", path, resp.StatusCode, raw, want)
	}
	return string(raw)
}

func postBatches(t *testing.T, base string, bs ...kafkaevents.Batch) string {
	t.Helper()
	body, err := json.Marshal(kafkaevents.Envelope{Batches: bs})
	if err != nil {
		t.Fatal(err)
	}
	return postRaw(t, base, "/events", body, 200)
}

// sample reads one unlabelled (or exactly labelled) sample from GET
// /metrics.
func sample(t *testing.T, base, series string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	t.Fatalf("metrics lack %s", series)
	return ""
}

func wantSample(t *testing.T, base, series, want string) {
	t.Helper()
	if got := sample(t, base, series); got != want {
		t.Errorf("%s = %s, want %s", series, got, want)
	}
}

func wantLedger(t *testing.T, s *Server, keys int, bytes int64) {
	t.Helper()
	if st, u := s.ledger.Stats(), s.ledger.SaltUsage("a"); st.Keys != keys || st.Bytes != bytes || u != bytes {
		t.Fatalf("ledger: %d keys, %d bytes, salt a %d; want %d keys, %d bytes", st.Keys, st.Bytes, u, keys, bytes)
	}
}

const (
	hashK = "0101010101010101010101010101010101010101010101010101010101010101"
	hashJ = "0202020202020202020202020202020202020202020202020202020202020202"
)

// TestTombstoneRefusesOlderStore: instance B's delete of K (ts +10) is read
// before instance A's store of K (ts 0), as a replay across partitions
// reads them. The store is admitted by the gate but not applied: the ledger
// holds 0 keys and 0 bytes, events_superseded_total is 1. A store at the
// delete's own ts is refused too (a delete at the same instant wins); a
// re-store at ts +20 is applied and clears the tombstone, and a later
// delete of the now-held key leaves none; a batch that deletes a held and
// an unknown key tombstones both.
func TestTombstoneRefusesOlderStore(t *testing.T) {
	s, base := tombCoord(t, nil)
	if got := postBatches(t, base, tombBatch("mp-b", 1, "delete", tsBase+10, hashK, 0)); got != `{"applied":1,"duplicates":0,"stale":0}` {
		t.Fatalf("delete reply %s", got)
	}
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "1")
	postBatches(t, base, tombBatch("mp-a", 1, "store", tsBase, hashK, 1000, hashJ, 30))
	wantLedger(t, s, 1, 30) // J applied, K superseded
	wantSample(t, base, "lmcache_coordinator_events_superseded_total", "1")
	wantSample(t, base, `lmcache_coordinator_events_ingested_total{type="store"}`, "1")
	postBatches(t, base, tombBatch("mp-a", 2, "store", tsBase+10, hashK, 1000))
	wantLedger(t, s, 1, 30)
	wantSample(t, base, "lmcache_coordinator_events_superseded_total", "2")

	postBatches(t, base, tombBatch("mp-a", 3, "store", tsBase+20, hashK, 2000))
	wantLedger(t, s, 2, 2030)
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "0")
	wantSample(t, base, "lmcache_coordinator_events_superseded_total", "2")

	postBatches(t, base, tombBatch("mp-b", 2, "delete", tsBase+30, hashK, 0))
	wantLedger(t, s, 1, 30)
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "0")
	// K is gone and not tombstoned: an older store is applied, as before.
	postBatches(t, base, tombBatch("mp-a", 4, "store", tsBase+25, hashK, 5))
	wantLedger(t, s, 2, 35)
	// A batch deleting J (held) and L (unknown) tombstones both: which one
	// missed is not known, and J's tombstone refuses only stores older than
	// its delete.
	const hashL = "0303030303030303030303030303030303030303030303030303030303030303"
	postBatches(t, base, tombBatch("mp-b", 3, "delete", tsBase+40, hashJ, 0, hashL, 0))
	wantLedger(t, s, 1, 5)
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "2")
	postBatches(t, base, tombBatch("mp-a", 5, "store", tsBase+35, hashJ, 30, hashL, 9))
	wantLedger(t, s, 1, 5)
	wantSample(t, base, "lmcache_coordinator_events_superseded_total", "4")
}

// TestTombstoneNewestDeleteWins: two deletes of an unknown key keep the
// newer ts, whatever their read order; a store between the two is refused.
func TestTombstoneNewestDeleteWins(t *testing.T) {
	s, base := tombCoord(t, nil)
	postBatches(t, base, tombBatch("mp-b", 1, "delete", tsBase+50, hashK, 0), tombBatch("mp-c", 1, "delete", tsBase+10, hashK, 0))
	postBatches(t, base, tombBatch("mp-a", 1, "store", tsBase+40, hashK, 7))
	wantLedger(t, s, 0, 0)
	wantSample(t, base, "lmcache_coordinator_events_superseded_total", "1")
	postBatches(t, base, tombBatch("mp-a", 2, "store", tsBase+51, hashK, 7))
	wantLedger(t, s, 1, 7)
}

// TestTombstoneBatchesWithoutTS: a POST /events batch without ts (the
// generic decoder's path) and the spec-era POST /quota/events take no part:
// they neither leave tombstones nor are refused by one.
func TestTombstoneBatchesWithoutTS(t *testing.T) {
	s, base := tombCoord(t, nil)
	noTS := func(b kafkaevents.Batch) []byte {
		raw, _ := json.Marshal(kafkaevents.Envelope{Batches: []kafkaevents.Batch{b}})
		var m map[string][]map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		delete(m["batches"][0], "ts")
		out, _ := json.Marshal(m)
		return out
	}
	postRaw(t, base, "/events", noTS(tombBatch("mp-b", 1, "delete", 0, hashJ, 0)), 200)
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "0")

	postBatches(t, base, tombBatch("mp-b", 2, "delete", tsBase+10, hashK, 0))
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "1")
	postRaw(t, base, "/events", noTS(tombBatch("mp-a", 1, "store", 0, hashK, 100)), 200)
	wantLedger(t, s, 1, 100)
	postRaw(t, base, "/quota/events", []byte(`{"instance_id":"mp-a","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"`+hashJ+`","model_name":"m","kv_rank":0,"cache_salt":"a"},"bytes":50}]}`), 200)
	wantLedger(t, s, 2, 150)
	wantSample(t, base, "lmcache_coordinator_events_superseded_total", "0")
}

// TestTombstonesBounded: the set holds at most max keys (the oldest
// dropped first, counted), a repeated delete keeps the newest ts, entries
// older than the TTL of event time expire (counted), and ts values that
// cannot be compared (0, NaN, far ahead of this clock) are not used.
func TestTombstonesBounded(t *testing.T) {
	tb := newTombstones()
	tb.max, tb.ttl = 3, 100
	tb.now = func() time.Time { return time.Unix(int64(tsBase), 0) }
	key := func(i int) ledger.Event {
		enc := tombKey(strings.Repeat(string("0123456789"[i]), 64))
		k, err := ledger.Prepare(&enc)
		if err != nil {
			t.Fatal(err)
		}
		return ledger.Event{Op: ledger.OpStore, Key: k, Bytes: int64(i)}
	}
	for i := range 5 {
		tb.deleted([]ledger.Event{key(i)}, tsBase-50+float64(i))
	}
	if n, capacity, expired := tb.counts(); n != 3 || capacity != 2 || expired != 0 {
		t.Fatalf("counts %d/%d/%d, want 3 live, 2 dropped for capacity, 0 expired", n, capacity, expired)
	}
	// Keys 0 and 1 were dropped: their old stores apply; 2..4 are refused.
	kept, sup := tb.stored([]ledger.Event{key(0), key(1), key(2), key(3), key(4)}, tsBase-60)
	if len(kept) != 2 || kept[0].Bytes != 0 || kept[1].Bytes != 1 || sup != 3 {
		t.Fatalf("kept %v superseded %d, want keys 0 and 1 kept, 3 superseded", kept, sup)
	}
	// A newer delete of key 2 moves it behind 3 and 4; an older one does not
	// lower its ts.
	tb.deleted([]ledger.Event{key(2)}, tsBase)
	tb.deleted([]ledger.Event{key(2)}, tsBase-100)
	last := tb.order.Front()
	for last != nil && last.Next() != nil {
		last = last.Next()
	}
	if e := tb.m[key(2).Key]; e == nil || e.Value.ts != tsBase || last != e {
		t.Fatalf("key 2's tombstone %+v, want ts %v at the tail", e, tsBase)
	}
	// Event time +55 (window from -45) expires 3 (ts -47) and 4 (ts -46),
	// not 2 (ts 0).
	if kept, sup := tb.stored(nil, tsBase+55); len(kept) != 0 || sup != 0 {
		t.Fatal("empty batch changed")
	}
	if n, _, expired := tb.counts(); n != 1 || expired != 2 {
		t.Fatalf("after expiry: %d live, %d expired; want 1 and 2", n, expired)
	}
	// A delete already older than the window leaves nothing.
	tb.deleted([]ledger.Event{key(7)}, tsBase-47)
	if n, _, _ := tb.counts(); n != 1 {
		t.Fatalf("an expired delete left a tombstone: %d live", n)
	}
	for _, ts := range []float64{0, math.NaN(), tsBase + 101} {
		if tb.usable(ts) {
			t.Errorf("ts %v usable", ts)
		}
	}
	if !tb.usable(tsBase + 100) {
		t.Error("a ts within the TTL ahead of the clock is not usable")
	}
}

// tombIDs are two instance ids the sink's partitioner (keyed by
// instance_id) puts on different partitions of a two-partition topic; the
// test checks that before it relies on it.
var tombIDs = [2]string{"mp-a", "mp-d"} // CRC-32 odd and even

// TestTombstoneKafkaTwoPartitions: over Kafka (kfake, a topic of two
// partitions) instance A's records land on one partition and B's on the
// other. B's delete of K (ts +10) is applied before A's store of K (ts 0)
// is even published, the order a replay across partitions can read them
// in: K stays out of the ledger and events_superseded_total is 1; A's
// re-store at ts +20 is applied. A second coordinator in a new group then
// replays the topic from the start in whatever order its fetches
// interleave the partitions, and a reference coordinator gets the same
// batches over POST /events in emission order: all three ledgers hold the
// same keys and bytes.
func TestTombstoneKafkaTwoPartitions(t *testing.T) {
	const topic = "lmcache-tombstones"
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	onKafka := func(group string) func(*config.Config) {
		return func(cfg *config.Config) {
			cfg.Ingest.EventTransport, cfg.Ingest.KafkaBootstrapServers = config.TransportKafka, strings.Join(kc.ListenAddrs(), ",")
			cfg.Ingest.KafkaTopic, cfg.Ingest.KafkaGroupID = topic, group
		}
	}
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: kc.ListenAddrs(), Topic: topic, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	publish := func(b kafkaevents.Batch) {
		t.Helper()
		if err := sink.Publish(context.Background(), []kafkaevents.Batch{b}); err != nil {
			t.Fatal(err)
		}
		if err := sink.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	applied := func(base string, n string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second) // a liveness bound
		for sample(t, base, "lmcache_coordinator_kafka_records_applied_total") != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: records applied %s, want %s", base, sample(t, base, "lmcache_coordinator_kafka_records_applied_total"), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	a, b := tombIDs[0], tombIDs[1]
	emitted := []kafkaevents.Batch{
		tombBatch(a, 1, "store", tsBase, hashK, 1000, hashJ, 30),
		tombBatch(b, 1, "delete", tsBase+10, hashK, 0),
		tombBatch(a, 2, "store", tsBase+20, hashK, 2000),
	}

	live, liveBase := tombCoord(t, onKafka("tomb-live"))
	publish(emitted[1])
	applied(liveBase, "1")
	publish(emitted[0])
	applied(liveBase, "2")
	wantLedger(t, live, 1, 30)
	wantSample(t, liveBase, "lmcache_coordinator_events_superseded_total", "1")
	publish(emitted[2])
	applied(liveBase, "3")
	wantLedger(t, live, 2, 2030)

	// The precondition: A's two records on one partition, B's on the other.
	kcl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer kcl.Close()
	ends, err := kadm.NewClient(kcl).ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	p0, _ := ends.Lookup(topic, 0)
	p1, _ := ends.Lookup(topic, 1)
	if p0.Offset+p1.Offset != 3 || p0.Offset != 1 && p1.Offset != 1 {
		t.Fatalf("end offsets %d and %d: %s and %s share a partition", p0.Offset, p1.Offset, a, b)
	}

	replay, replayBase := tombCoord(t, onKafka("tomb-replay"))
	applied(replayBase, "3")
	wantLedger(t, replay, 2, 2030)

	ref, refBase := tombCoord(t, nil)
	postBatches(t, refBase, emitted...)
	wantLedger(t, ref, 2, 2030)
	wantSample(t, refBase, "lmcache_coordinator_events_superseded_total", "0")
}

// TestCheckpointKeepsTombstones: a tombstone outlives a restart from the
// checkpoint (section "tombstones"): B's delete of K (ts +10) is read and
// checkpointed before A's older store of K (ts 0), which a replay after the
// restart reads; the restored coordinator refuses it (ledger empty,
// superseded 1), as the one that wrote the checkpoint would have.
func TestCheckpointKeepsTombstones(t *testing.T) {
	path := filepath.Join(t.TempDir(), "coord.ckpt")
	withCkpt := func(cfg *config.Config) { cfg.Ingest.CheckpointPath, cfg.Ingest.CheckpointInterval = path, 0 }
	first, base := tombCoord(t, withCkpt)
	postBatches(t, base, tombBatch("mp-b", 1, "delete", tsBase+10, hashK, 0))
	wantSample(t, base, "lmcache_coordinator_event_tombstones", "1")
	if err := first.SaveCheckpoint(); err != nil {
		t.Fatal(err)
	}

	second, base2 := tombCoord(t, withCkpt)
	wantSample(t, base2, "lmcache_coordinator_checkpoint_load_failures_total", "0")
	wantSample(t, base2, "lmcache_coordinator_event_tombstones", "1")
	postBatches(t, base2, tombBatch("mp-a", 1, "store", tsBase, hashK, 1000))
	wantLedger(t, second, 0, 0)
	wantSample(t, base2, "lmcache_coordinator_events_superseded_total", "1")
	// A newer store is a real re-store: applied, tombstone cleared.
	postBatches(t, base2, tombBatch("mp-a", 2, "store", tsBase+20, hashK, 1000))
	wantLedger(t, second, 1, 1000)
	wantSample(t, base2, "lmcache_coordinator_event_tombstones", "0")
}
