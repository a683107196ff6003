package kafkaevents_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
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

// Concurrent Publish calls share the record cap: the check of the cap and the
// queueing of the record are one step, so publishers released at once while
// the brokers hold every produce request queue exactly the cap and the rest
// are refused with ErrRefused (counted as dropped); once the brokers answer,
// every queued record is delivered. Each round starts from an empty buffer.
//
// This test needs to hold produce requests, which only the in-process kfake
// cluster can do, so it does not run against LMCACHE_TEST_KAFKA_BROKERS.
func TestConcurrentPublishersNeverOvershootTheRecordCap(t *testing.T) {
	const capRecords, publishers, list, rounds = 64, 8, 32, 30
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "contended"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	release := make(chan struct{})
	// Every produce request waits until its round's release is closed:
	// nothing is delivered while the publishers race for the slots.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		ch := release
		mu.Unlock()
		c.SleepControl(func() { <-ch })
		return nil, nil, false
	})
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: c.ListenAddrs(), Topic: "contended",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	kafkaevents.SetMaxBufferedRecords(sink, capRecords)
	ctx := context.Background()
	seq := int64(0)
	for round := range rounds {
		ch := make(chan struct{})
		mu.Lock()
		release = ch
		mu.Unlock()
		lists := make([][]kafkaevents.Batch, publishers)
		for p := range lists {
			for range list {
				seq++
				lists[p] = append(lists[p], configBatch(seq))
			}
		}
		sent, dropped := sink.DeliveredBatches(), sink.DroppedBatches()
		start := make(chan struct{})
		results := make(chan error, publishers)
		var wg sync.WaitGroup
		for _, batches := range lists {
			wg.Go(func() {
				<-start
				results <- sink.Publish(ctx, batches)
			})
		}
		close(start)
		wg.Wait()
		close(results)
		for err := range results {
			if err != nil && !errors.Is(err, kafkaevents.ErrRefused) {
				t.Fatalf("round %d: Publish: %v", round, err)
			}
		}
		close(ch)
		fctx, cancel := context.WithTimeout(ctx, waitFor)
		err := sink.Flush(fctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got, gone := sink.DeliveredBatches()-sent, sink.DroppedBatches()-dropped; got != capRecords || gone != publishers*list-capRecords {
			t.Fatalf("round %d: %d records raced for %d free slots: %d queued and delivered, %d refused; want %d and %d",
				round, publishers*list, capRecords, got, gone, capRecords, publishers*list-capRecords)
		}
	}
}

// The byte cap Publish checks counts a record's key as well as its value,
// as the producer does: a record whose value fits the cap but whose key and
// value together do not is refused with ErrRefused, not accepted by Publish
// and then dropped by the producer behind the caller's back.
func TestPublishCountsTheKeyAgainstTheByteCap(t *testing.T) {
	brokers, topic := newTopic(t, 1)
	sink := newSink(t, brokers, topic)
	b := configBatch(1)
	b.Backend = ""
	empty, err := kafkaevents.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	// The value (the backend's x's need no escaping) is within the cap by
	// len(key)-1 bytes; with its key it is one byte over.
	b.Backend = strings.Repeat("x", kafkaevents.MaxBufferedBytes-len(b.InstanceID)+1-len(empty))
	if err := sink.Publish(context.Background(), []kafkaevents.Batch{b}); !errors.Is(err, kafkaevents.ErrRefused) {
		t.Errorf("Publish of a record of %d bytes with its key (cap %d): %v, want ErrRefused", kafkaevents.MaxBufferedBytes+1, kafkaevents.MaxBufferedBytes, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := sink.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if sink.DroppedBatches() != 1 || sink.DeliveredBatches() != 0 {
		t.Errorf("dropped %d, delivered %d; want 1 and 0", sink.DroppedBatches(), sink.DeliveredBatches())
	}
}
