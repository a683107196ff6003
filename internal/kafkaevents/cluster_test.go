package kafkaevents_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// brokersEnv, when set (comma-separated), points the tests at a real Kafka
// instead of franz-go's in-process kfake cluster.
const brokersEnv = "LMCACHE_TEST_KAFKA_BROKERS"

var topicSeq atomic.Int64

// newTopic returns brokers and a fresh topic with the given partition count:
// on a kfake cluster of three brokers torn down with the test, or on the real
// Kafka named by LMCACHE_TEST_KAFKA_BROKERS.
func newTopic(t *testing.T, partitions int32) ([]string, string) {
	return newTopicB(t, partitions)
}

// newTopicB is newTopic for tests and benchmarks.
func newTopicB(t testing.TB, partitions int32) ([]string, string) {
	t.Helper()
	topic := fmt.Sprintf("lmcache-cache-events-%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano(), topicSeq.Add(1))
	if env := os.Getenv(brokersEnv); env != "" {
		brokers := strings.Split(env, ",")
		createTopic(t, brokers, topic, partitions)
		return brokers, topic
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs(), topic
}

// adminClient returns a plain client closed with the test and a request
// context bounded by its deadline.
func adminClient(t testing.TB, brokers []string) (*kgo.Client, context.Context) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return cl, ctx
}

func createTopic(t testing.TB, brokers []string, topic string, partitions int32) {
	t.Helper()
	cl, ctx := adminClient(t, brokers)
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, -1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic %s: %+v", topic, resp.Topics)
	}
}

// committed reads the group's committed offset for one partition (-1: none).
func committed(t *testing.T, brokers []string, group, topic string, partition int32) int64 {
	t.Helper()
	cl, ctx := adminClient(t, brokers)
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = topic, []int32{partition}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if p.Partition == partition {
				return p.Offset
			}
		}
	}
	return -1
}

// produceRaw writes records as they are, bypassing the Sink (foreign or
// corrupt producers).
func produceRaw(t *testing.T, brokers []string, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}
