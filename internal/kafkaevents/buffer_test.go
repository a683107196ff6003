package kafkaevents_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// configBatch is a small valid batch (no entries), so that many fit in the
// byte cap and the record cap is the one a test reaches.
func configBatch(seq int64) kafkaevents.Batch {
	return kafkaevents.Batch{InstanceID: "mp-a", Incarnation: 1, Seq: seq, EventType: kafkaevents.EventConfig,
		Tier: kafkaevents.TierL1, Backend: "dram", Entries: []kafkaevents.Entry{}}
}

// While the brokers take no records (an outage), the Sink holds as many as
// upstream's librdkafka producer does (queue.buffering.max.messages, 100000,
// which upstream leaves at its default, within its 64 MiB), not franz-go's
// default of 50000; the next Publish is refused with ErrRefused and counted
// at once; once the brokers answer, every held record is delivered.
//
// This test needs to hold produce requests, which only the in-process kfake
// cluster can do, so it does not run against LMCACHE_TEST_KAFKA_BROKERS.
func TestSinkHoldsUpstreamsRecordCountDuringAnOutage(t *testing.T) {
	const held, list = 100000, 1000
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "outage"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	// Every produce request waits until release is closed, then is handled
	// as usual: the records stay buffered in the producer meanwhile.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: c.ListenAddrs(), Topic: "outage",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	ctx := context.Background()
	for first := int64(1); first <= held; first += list {
		batches := make([]kafkaevents.Batch, list)
		for i := range batches {
			batches[i] = configBatch(first + int64(i))
		}
		if err := sink.Publish(ctx, batches); err != nil {
			t.Fatalf("Publish of seq %d..%d during the outage: %v", first, first+list-1, err)
		}
	}
	if err := sink.Publish(ctx, []kafkaevents.Batch{configBatch(held + 1)}); !errors.Is(err, kafkaevents.ErrRefused) || sink.DroppedBatches() != 1 {
		t.Errorf("Publish of record %d with %d held: %v, dropped %d; want ErrRefused and 1", held+1, held, err, sink.DroppedBatches())
	}
	open()
	fctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	if err := sink.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	if sink.DeliveredBatches() != held || sink.DroppedBatches() != 1 {
		t.Fatalf("after the outage: delivered %d, dropped %d; want %d and 1", sink.DeliveredBatches(), sink.DroppedBatches(), held)
	}
}
