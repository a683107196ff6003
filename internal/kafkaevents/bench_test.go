package kafkaevents_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// BenchmarkDecode is the Source's per-record decode and validation of a
// 64-entry store batch; BenchmarkDecodeBaseline is a plain json.Unmarshal of
// the same value into the same types, without presence checks or validation.
func BenchmarkDecode(b *testing.B) {
	v := benchValue(b)
	b.SetBytes(int64(len(v)))
	for b.Loop() {
		if _, err := kafkaevents.Decode(v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeBaseline(b *testing.B) {
	v := benchValue(b)
	b.SetBytes(int64(len(v)))
	for b.Loop() {
		var env kafkaevents.Envelope
		if err := json.Unmarshal(v, &env); err != nil {
			b.Fatal(err)
		}
	}
}

func benchValue(b *testing.B) []byte {
	b.Helper()
	batch := storeBatch("mp-a", 1)
	entry := batch.Entries[0]
	batch.Entries = nil
	for i := range 64 {
		e := entry
		e.Key.ChunkHashHex = fmt.Sprintf("%064x", i+1)
		e.TokenIDs = make([]int64, 256)
		batch.Entries = append(batch.Entries, e)
	}
	v, err := kafkaevents.Encode(batch)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// BenchmarkSinkToSource is records per second from Sink.Publish to Apply
// through a kfake cluster (or LMCACHE_TEST_KAFKA_BROKERS), one-entry batches.
func BenchmarkSinkToSource(b *testing.B) {
	brokers, topic := newTopicB(b, 3)
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: brokers, Topic: topic})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	got := make(chan struct{}, 1024)
	src, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: brokers, Topic: topic, GroupID: "g-bench"},
		kafkaevents.ApplierFunc(func(context.Context, kafkaevents.Record) error { got <- struct{}{}; return nil }))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	ids := []string{"mp-a", "mp-b", "mp-c", "mp-d"}
	b.ResetTimer()
	for i := range b.N {
		if err := sink.Publish(ctx, []kafkaevents.Batch{storeBatch(ids[i%len(ids)], int64(i/len(ids)+1))}); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		<-got
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
