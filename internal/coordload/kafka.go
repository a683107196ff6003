package coordload

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// KafkaConfig is one run that plays a fleet of MP servers publishing their
// cache events to Kafka, as `lmcache server --coordinator-event-transport
// kafka` does (upstream's record format, one record per batch keyed by
// instance_id), instead of posting them to the coordinator.
type KafkaConfig struct {
	// Brokers and Topic are the cluster and the coordinator's topic.
	Brokers []string
	Topic   string
	// Keys, Batch, Salts, Instances, Bytes and Offset mean what they mean
	// in Config: Keys distinct stores, Batch entries per batch.
	Keys, Batch, Salts, Instances int
	Bytes                         int64
	Offset                        int
}

// Validate checks the ranges.
func (c KafkaConfig) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("kafka load: no brokers")
	case c.Topic == "":
		return errors.New("kafka load: no topic")
	case c.Keys < 1 || c.Batch < 1 || c.Salts < 1 || c.Instances < 1:
		return errors.New("kafka load: keys, batch, salts and instances must be at least 1")
	case c.Bytes < 0 || c.Offset < 0:
		return errors.New("kafka load: bytes and offset must not be negative")
	}
	return nil
}

// CacheBatches returns the store batches of cfg: batch b carries keys
// [b*Batch, (b+1)*Batch) (shifted by Offset) and belongs to instance b mod
// Instances, whose seq numbers count up from 1 in order. The same batches
// serve the Kafka producer and an HTTP POST /events baseline.
func CacheBatches(cfg KafkaConfig) []kafkaevents.Batch {
	seqs := make([]int64, cfg.Instances)
	n := (cfg.Keys + cfg.Batch - 1) / cfg.Batch
	out := make([]kafkaevents.Batch, 0, n)
	for b := 0; b < n; b++ {
		inst := b % cfg.Instances
		seqs[inst]++
		entries := make([]kafkaevents.Entry, 0, cfg.Batch)
		for i := b * cfg.Batch; i < min((b+1)*cfg.Batch, cfg.Keys); i++ {
			k := cfg.Offset + i
			entries = append(entries, kafkaevents.Entry{
				Key:       objkey.Encoded{ChunkHashHex: ChunkHash(k), ModelName: models[k%len(models)], KVRank: kvRank, CacheSalt: SaltName(k % cfg.Salts)},
				SizeBytes: cfg.Bytes, TokenIDs: []int64{}, TokenOffset: kafkaevents.UnknownTokenOffset,
			})
		}
		out = append(out, kafkaevents.Batch{InstanceID: InstanceName(inst), Incarnation: 1, Seq: seqs[inst],
			EventType: kafkaevents.EventStore, Tier: kafkaevents.TierL2, Backend: "s3",
			TS: kafkaevents.PyFloat(1767225600 + float64(b)), Entries: entries})
	}
	return out
}

const flushEvery = 64

// PublishKafka produces batches through a kafkaevents.Sink (the MP
// server's producer: idempotent, acks=all) and waits until every record is
// acknowledged. It returns how long publishing took.
func PublishKafka(ctx context.Context, cfg KafkaConfig, batches []kafkaevents.Batch) (time.Duration, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: cfg.Brokers, Topic: cfg.Topic, DeliveryTimeout: time.Minute})
	if err != nil {
		return 0, fmt.Errorf("kafka load: %w", err)
	}
	defer sink.Close()
	began := time.Now()
	for i := range batches {
		// The producer buffers at most 64 MiB; flushing every
		// flushEvery batches (about 15 MiB at 1,000 keys a batch) keeps
		// Publish from ever being refused while records stay pipelined.
		if i > 0 && i%flushEvery == 0 {
			if err := sink.Flush(ctx); err != nil {
				return time.Since(began), fmt.Errorf("kafka load: flush: %w", err)
			}
		}
		if err := sink.Publish(ctx, batches[i:i+1]); err != nil {
			return time.Since(began), fmt.Errorf("kafka load: batch %d: %w", i, err)
		}
	}
	if err := sink.Flush(ctx); err != nil {
		return time.Since(began), fmt.Errorf("kafka load: flush: %w", err)
	}
	if d := sink.DroppedBatches(); d != 0 {
		return time.Since(began), fmt.Errorf("kafka load: %d batches dropped", d)
	}
	return time.Since(began), nil
}
