package coordinator_test

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/etcdtest"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// haResyncLRU is salt a's LRU order (oldest first) after the stores of 01
// to 05 and the accesses of 02 and 04, and haResyncListing the same keys
// listed newest-first with 7 bytes each: a resync from that listing would
// make its order the LRU order (a/04,a/02,a/05,a/03,a/01) and 35 bytes
// the usage.
const haResyncLRU = "a/01,a/03,a/05,a/02,a/04"

func haResyncListing() []mpPage {
	return []mpPage{{entries: []any{entry("04", "a", 7), entry("02", "a", 7), entry("05", "a", 7),
		entry("03", "a", 7), entry("01", "a", 7)}}}
}

// haResyncConfig: the startup resync on (polling fast), an eviction ratio
// of 1 (lruVictims), no eviction loop (cycles run by hand).
func haResyncConfig(cfg *config.Config) {
	cfg.EnableStartupResync, cfg.ResyncPollInterval, cfg.ResyncMaxWait = true, 0.01, 10
	cfg.EvictionRatio = 1
}

func resyncThread(c *coord) string {
	_, raw := c.do("GET", "/periodic-threads/"+coordinator.LoopResync, nil)
	return string(raw)
}

func kafkaEntries(sizes map[string]int64, hashes ...string) []kafkaevents.Entry {
	out := make([]kafkaevents.Entry, len(hashes))
	for i, h := range hashes {
		out[i] = kafkaevents.Entry{Key: objkey.Encoded{ChunkHashHex: h, ModelName: "m", KVRank: rank1, CacheSalt: "a"},
			SizeBytes: sizes[h], TokenIDs: []int64{}, TokenOffset: kafkaevents.UnknownTokenOffset}
	}
	return out
}

// publishHAResyncRecords publishes mp-1's two records of salt a to topic:
// the stores of 01 to 05 (6 MiB) and the accesses of 02 and 04, which make
// haResyncLRU its LRU order.
func publishHAResyncRecords(t *testing.T, kc *kfake.Cluster, topic string) {
	t.Helper()
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: kc.ListenAddrs(), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	sizes := map[string]int64{"01": mib, "02": 2 * mib, "03": mib, "04": mib, "05": mib}
	batch := func(seq int64, typ string, entries []kafkaevents.Entry) kafkaevents.Batch {
		return kafkaevents.Batch{InstanceID: "mp-1", Incarnation: 1, Seq: seq, EventType: typ, Tier: kafkaevents.TierL2,
			Backend: "fs", Entries: entries, TS: 1}
	}
	if err := sink.Publish(context.Background(), []kafkaevents.Batch{
		batch(1, kafkaevents.EventStore, kafkaEntries(sizes, "01", "02", "03", "04", "05")),
		batch(2, kafkaevents.EventAccess, kafkaEntries(map[string]int64{}, "02", "04")),
	}); err != nil {
		t.Fatal(err)
	}
	if err := sink.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestHAKafkaNewLeaderSkipsResync: two HA coordinators on a real etcd
// cluster consume one Kafka topic (kfake), each in its own group, with the
// startup resync on. The leader skips its resync (it leads on the stream's
// ledger); the standby's ledger is fed by the stream (usage 6 MiB) and its
// resync loop waits. When the leader stops, the standby leads and skips
// its resync too: logged at INFO, lmcache_coordinator_startup_resync_skipped_total
// 1, the MP server's listing (another order, other sizes) read 0 times,
// and its eviction victims are salt a's LRU order from the stream.
func TestHAKafkaNewLeaderSkipsResync(t *testing.T) {
	const topic = "lmcache-cache-events-ha-resync"
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := strings.Join(kc.ListenAddrs(), ",")
	cl := etcdtest.Start(t, 3)
	mp := newMP(t)
	mp.pages = haResyncListing()
	onKafka := func(cfg *config.Config) {
		haResyncConfig(cfg)
		cfg.Ingest.EventTransport, cfg.Ingest.KafkaBootstrapServers, cfg.Ingest.KafkaTopic = config.TransportKafka, brokers, topic
	}
	a := startHA(t, cl.Endpoints, onKafka)
	waitFor(t, "A ready", func() bool { code, _ := a.readyz(); return code == 200 })
	b := startHA(t, cl.Endpoints, onKafka)
	waitFor(t, "B sees A lead", func() bool {
		code, r := b.readyz()
		return code == 503 && r["role"] == "standby" && r["leader"] == a.base
	})
	mp.register(a, "mp-1")
	mp.register(b, "mp-1")

	publishHAResyncRecords(t, kc, topic)
	for _, c := range []*coord{a, b} {
		waitFor(t, c.base+" applies both records", func() bool {
			return c.metric("lmcache_coordinator_kafka_records_applied_total") == 2
		})
		if got := c.usageBytes("a"); got != 6*mib {
			t.Fatalf("%s: salt a usage %d from the stream, want %d", c.base, got, 6*mib)
		}
	}
	// The first leader skips too: it leads on the stream's ledger.
	waitFor(t, "A skips its resync", func() bool { return a.metric("lmcache_coordinator_startup_resync_skipped_total") == 1 })
	waitFor(t, "the standby's resync loop to wait", func() bool {
		return strings.Contains(resyncThread(b), "standby: on kafka this coordinator will not resync when it leads")
	})
	if got := b.metric("lmcache_coordinator_startup_resync_skipped_total"); got != 0 {
		t.Fatalf("standby skipped counter %v before it leads, want 0", got)
	}

	a.stop()
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B leads", func() bool { code, _ := b.readyz(); return code == 200 })
	waitFor(t, "B skips its resync", func() bool { return b.metric("lmcache_coordinator_startup_resync_skipped_total") == 1 })
	if th := resyncThread(b); !strings.Contains(th, "skipped: leading on the kafka stream's ledger") {
		t.Errorf("B's resync thread: %s", th)
	}
	if !b.logs.Has(`msg="startup resync skipped: leading in HA mode on kafka`) || !b.logs.Has("keys=5") {
		t.Errorf("no INFO line about B's skipped resync:\n%s", b.logs.String())
	}
	if got := b.metric("lmcache_coordinator_resync_keys_total"); got != 0 {
		t.Errorf("B resynced %v keys, want 0", got)
	}
	if got := b.usageBytes("a"); got != 6*mib {
		t.Errorf("B's salt a usage after it leads %d, want %d (the stream's)", got, 6*mib)
	}
	if got := lruVictims(t, b, mp, "a"); got != haResyncLRU {
		t.Errorf("B's LRU order after it leads %s, want the stream's %s", got, haResyncLRU)
	}
	if n := mp.listCount(); n != 0 {
		t.Errorf("the MP server's listing was read %d times, want 0", n)
	}
}

// TestHAHTTPNewLeaderStillResyncs is the HTTP counterpart: an MP server
// reports to whichever coordinator it reaches, so a standby's ledger is
// partial and a coordinator that comes to lead resyncs, as before. B
// ingests salt a over HTTP while standby; when A stops and B leads, it
// reads its MP server's listing once, and the listing's order and sizes
// become salt a's LRU order and usage. No skip is counted (the counter is
// not exported without a checkpoint or Kafka).
func TestHAHTTPNewLeaderStillResyncs(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	mpA, mpB := newMP(t), newMP(t)
	mpB.pages = haResyncListing()
	a := startHA(t, cl.Endpoints, haResyncConfig)
	waitFor(t, "A ready", func() bool { code, _ := a.readyz(); return code == 200 })
	b := startHA(t, cl.Endpoints, haResyncConfig)
	waitFor(t, "B sees A lead", func() bool {
		code, r := b.readyz()
		return code == 503 && r["role"] == "standby" && r["leader"] == a.base
	})
	mpA.register(a, "mp-a")
	mpB.register(b, "mp-b")
	b.events(rev("store", "01", "a", mib), rev("store", "02", "a", 2*mib), rev("store", "03", "a", mib),
		rev("store", "04", "a", mib), rev("store", "05", "a", mib))
	b.events(rev("lookup", "02", "a", 0), rev("lookup", "04", "a", 0))
	if got := b.usageBytes("a"); got != 6*mib {
		t.Fatalf("B's salt a usage %d, want %d", got, 6*mib)
	}
	// A resyncs from its server (an empty fake answers 503: one listing).
	waitFor(t, "A's resync listing", func() bool { return mpA.listCount() == 1 })
	waitFor(t, "the standby's resync loop to wait", func() bool {
		return strings.Contains(resyncThread(b), "standby: resync runs once this coordinator leads")
	})
	if n := mpB.listCount(); n != 0 {
		t.Fatalf("standby read its listing %d times, want 0", n)
	}

	a.stop()
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B leads", func() bool { code, _ := b.readyz(); return code == 200 })
	waitFor(t, "B's resync", func() bool { return b.metric("lmcache_coordinator_resync_keys_total") == 5 })
	waitFor(t, "B's resync loop to finish", func() bool {
		return strings.Contains(resyncThread(b), "finished: 5 keys from mp-b")
	})
	if n := mpB.listCount(); n != 1 {
		t.Errorf("B read its listing %d times, want 1", n)
	}
	if got := b.usageBytes("a"); got != 35 {
		t.Errorf("B's salt a usage after its resync %d, want 35 (the listing's)", got)
	}
	if got := lruVictims(t, b, mpB, "a"); got != "a/04,a/02,a/05,a/03,a/01" {
		t.Errorf("B's LRU order after its resync %s, want the listing order", got)
	}
	for _, c := range []*coord{a, b} {
		if c.logs.Has("startup resync skipped") {
			t.Errorf("%s logged a skipped resync over HTTP", c.base)
		}
	}
	if _, raw := b.do("GET", "/metrics", nil); strings.Contains(string(raw), "startup_resync_skipped_total") {
		t.Errorf("skip counter exported over HTTP without a checkpoint")
	}
}

// TestHAKafkaRestartWithoutCheckpointReadsFromStart: an HA coordinator on
// Kafka without --checkpoint-path never resyncs, so after a restart its
// empty ledger can only learn what came before its group's committed
// offset from the stream. A applies two records and stops cleanly, which
// commits offset 2 for its group; B, in the same group with no checkpoint,
// reads both records again (from the earliest retained offset) and holds
// salt a's 6 MiB in the stream's LRU order, not an empty ledger.
func TestHAKafkaRestartWithoutCheckpointReadsFromStart(t *testing.T) {
	const topic, group = "lmcache-cache-events-ha-restart", "ha-restart-group"
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	cl := etcdtest.Start(t, 3)
	mp := newMP(t)
	mp.pages = haResyncListing()
	onKafka := func(cfg *config.Config) {
		haResyncConfig(cfg)
		cfg.Ingest.EventTransport, cfg.Ingest.KafkaBootstrapServers, cfg.Ingest.KafkaTopic = config.TransportKafka, strings.Join(kc.ListenAddrs(), ","), topic
		cfg.Ingest.KafkaGroupID = group // explicit: kept as given, so A and B share it
	}
	publishHAResyncRecords(t, kc, topic)

	a := startHA(t, cl.Endpoints, onKafka)
	waitFor(t, "A applies both records", func() bool { return a.metric("lmcache_coordinator_kafka_records_applied_total") == 2 })
	a.stop()
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}
	// The precondition: the group's commit is past both records, so a
	// start from the committed offset would read nothing.
	kcl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer kcl.Close()
	offs, err := kadm.NewClient(kcl).FetchOffsets(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(topic, 0); !ok || o.At != 2 {
		t.Fatalf("group %s committed offset %+v (found %v), want 2", group, o, ok)
	}

	b := startHA(t, cl.Endpoints, onKafka)
	mp.register(b, "mp-1")
	waitFor(t, "B leads", func() bool { code, _ := b.readyz(); return code == 200 })
	waitFor(t, "B re-reads both records", func() bool { return b.metric("lmcache_coordinator_kafka_records_applied_total") == 2 })
	if got := b.usageBytes("a"); got != 6*mib {
		t.Errorf("B's salt a usage %d, want %d (the stream's, read from the start)", got, 6*mib)
	}
	if got := lruVictims(t, b, mp, "a"); got != haResyncLRU {
		t.Errorf("B's LRU order %s, want the stream's %s", got, haResyncLRU)
	}
	if n := mp.listCount(); n != 0 {
		t.Errorf("the MP server's listing was read %d times, want 0", n)
	}
}
