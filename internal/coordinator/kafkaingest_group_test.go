package coordinator_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// TestKafkaSharedGroupWarns: a coordinator on Kafka whose consumer group
// another consumer joins holds only some of the topic's partitions. Its
// /metrics shows that (partitions assigned below the topic's 2), and
// after the lag loop saw it for the set number of cycles (2 here, lowered
// once the coordinator held both partitions, so its own join cannot count)
// it logs one warning naming the group; once the other consumer leaves it
// holds both partitions again.
func TestKafkaSharedGroupWarns(t *testing.T) {
	defer coordinator.SetSharedGroupCycles(1 << 40)()
	const topic, group = "lmcache-shared-group", "g-shared"
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	c := startCoord(t, func(cfg *config.Config) {
		cfg.Ingest.EventTransport, cfg.Ingest.KafkaBootstrapServers = config.TransportKafka, strings.Join(kc.ListenAddrs(), ",")
		cfg.Ingest.KafkaTopic, cfg.Ingest.KafkaGroupID = topic, group
	})
	has := func(line string) func() bool {
		return func() bool { _, raw := c.do("GET", "/metrics", nil); return strings.Contains(string(raw), line+"\n") }
	}
	waitFor(t, "the coordinator to hold both partitions", has("lmcache_coordinator_kafka_partitions_assigned 2"))
	waitFor(t, "the topic's partition count", has("lmcache_coordinator_kafka_topic_partitions 2"))
	coordinator.SetSharedGroupCycles(2)

	other, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: kc.ListenAddrs(), Topic: topic, GroupID: group,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, kafkaevents.ApplierFunc(func(context.Context, kafkaevents.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- other.Run(ctx) }()
	stopOther := func() {
		if cancel != nil {
			cancel()
			cancel = nil
			if err := <-done; err != nil {
				t.Errorf("the other consumer: %v", err)
			}
		}
	}
	t.Cleanup(stopOther)
	waitFor(t, "the group to give the other consumer a partition", has("lmcache_coordinator_kafka_partitions_assigned 1"))
	waitFor(t, "the shared-group warning", func() bool { return strings.Contains(c.logs.String(), "consumer group is shared") })
	logs := c.logs.String()
	if strings.Count(logs, "consumer group is shared") != 1 || !strings.Contains(logs, "group_id="+group) || !strings.Contains(logs, "partitions_held=1") {
		t.Fatalf("want one warning naming the group and the 1 partition held:\n%s", logs)
	}
	stopOther()
	waitFor(t, "the coordinator to hold both partitions again", has("lmcache_coordinator_kafka_partitions_assigned 2"))
}
