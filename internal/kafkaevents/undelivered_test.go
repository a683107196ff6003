package kafkaevents_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/logtest"
)

// TestUndeliveredWarnThrottled: when the brokers refuse every record (a
// non-retriable produce error), each is counted as dropped but the WARN is
// written once per interval, the next line saying how many it held back;
// a line per record would be up to MaxBufferedRecords lines at once.
func TestUndeliveredWarnThrottled(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "refusing"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = 87 // INVALID_RECORD: not retried
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	var logs logtest.Buffer
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: c.ListenAddrs(), Topic: "refusing",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC).UnixNano())
	kafkaevents.SetWarnClock(sink, func() time.Time { return time.Unix(0, now.Load()) })
	publish := func(first, n int64) {
		t.Helper()
		batches := make([]kafkaevents.Batch, n)
		for i := range batches {
			batches[i] = configBatch(first + int64(i))
		}
		if err := sink.Publish(context.Background(), batches); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sink.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	publish(1, 500)
	lines := func() int { return strings.Count(logs.String(), "kafka did not deliver a cache-event record") }
	if sent, dropped := sink.DeliveredBatches(), sink.DroppedBatches(); sent != 0 || dropped != 500 || lines() != 1 {
		t.Fatalf("after 500 refused records: sent %d dropped %d, %d WARN lines; want 0, 500, 1\n%s", sent, dropped, lines(), logs.String())
	}
	now.Add(int64(11 * time.Second))
	publish(501, 1)
	if dropped := sink.DroppedBatches(); dropped != 501 || lines() != 2 || !logs.Has("suppressed=499") {
		t.Fatalf("a refused record 11 s later: dropped %d, %d WARN lines; want 501 and a second line with suppressed=499\n%s", dropped, lines(), logs.String())
	}
}
