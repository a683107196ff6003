package kafkaevents

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lmcache-go/lmcache/internal/logthrottle"
)

// Sink defaults, as upstream's KafkaCacheEventSink sets them.
const (
	// DefaultDeliveryTimeout is --coordinator-kafka-delivery-timeout's
	// default: how long the producer retries a record before dropping it.
	DefaultDeliveryTimeout = 300 * time.Second
	// MaxBufferedBytes caps what the producer holds (upstream's
	// queue.buffering.max.kbytes of 64 MiB).
	MaxBufferedBytes = 64 << 20
	// MaxBufferedRecords caps how many records the producer holds:
	// librdkafka's queue.buffering.max.messages default, which upstream
	// leaves as is. franz-go's own default (50000) would start dropping
	// batches at half the depth upstream holds through a broker outage,
	// and would refuse them inside TryProduce, where Publish cannot
	// report ErrRefused.
	MaxBufferedRecords = 100000
	// undeliveredWarnEvery bounds the undelivered-record WARN to one line
	// per interval (the line says how many it held back).
	undeliveredWarnEvery = 10 * time.Second
	// CloseFlushTimeout bounds how long Close waits for queued records.
	CloseFlushTimeout = 10 * time.Second
	sinkClientID      = "lmcache-cache-events"
)

// ErrRefused is returned by Publish when the producer buffer is full or the
// sink is closed: the refused batch and the rest of the list are dropped
// (counted in DroppedBatches), leaving a seq gap the coordinator sees.
var ErrRefused = errors.New("kafka producer refused cache-event batches")

// SinkConfig configures a Sink.
type SinkConfig struct {
	// Brokers are the bootstrap servers (--coordinator-kafka-bootstrap-servers).
	Brokers []string
	// Topic defaults to DefaultTopic (--coordinator-kafka-topic).
	Topic string
	// DeliveryTimeout defaults to DefaultDeliveryTimeout
	// (--coordinator-kafka-delivery-timeout).
	DeliveryTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Sink publishes cache-event batches to Kafka, one record per batch keyed by
// instance_id. Publish does not wait for the broker; the idempotent producer
// retries in order until DeliveryTimeout, then drops the record and counts it.
// Safe for concurrent use; the client's goroutines stop in Close.
type Sink struct {
	cl  *kgo.Client
	log *slog.Logger
	// warns throttles the per-record delivery WARN: at the delivery
	// timeout of an outage every held record (up to MaxBufferedRecords)
	// fails at once; the dropped counter still counts each.
	warns *logthrottle.Limiter
	topic string
	// produceMu makes Publish's check of the buffer caps and the
	// TryProduce that fills the slot one step: franz-go counts a record
	// as buffered inside TryProduce, so two Publish calls checking at
	// once could both see the last free slot, and the producer would drop
	// the second record through its promise while Publish returned nil
	// (and let the rest of that list in behind the gap). Close sets
	// closed under it, so no record is queued after Close began.
	produceMu sync.Mutex
	// maxRecords is MaxBufferedRecords (tests lower it).
	maxRecords int64
	closed     atomic.Bool
	dropped    atomic.Int64
	sent       atomic.Int64
}

// ParseBrokers splits a comma-separated bootstrap-servers value, the form
// upstream's flags take. It refuses an empty list or an empty element.
func ParseBrokers(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("kafka bootstrap servers must be non-empty")
	}
	var out []string
	for _, b := range strings.Split(s, ",") {
		b = strings.TrimSpace(b)
		if b == "" {
			return nil, fmt.Errorf("kafka bootstrap servers %q has an empty element", s)
		}
		out = append(out, b)
	}
	return out, nil
}

// librdkafkaPartition is librdkafka's default "consistent_random" partitioner
// for keyed records (CRC-32 of the key, modulo the partition count), which
// upstream's confluent-kafka producer uses. Matching it keeps one instance's
// records on the same partition whichever implementation produced them, so
// the per-instance order survives a Python/Go swap on one topic.
func librdkafkaPartition(key []byte, n int) int {
	return int(crc32.ChecksumIEEE(key) % uint32(n))
}

// NewSink connects a producer. It does not wait for the brokers: records
// queue until they are reachable or DeliveryTimeout passes.
func NewSink(cfg SinkConfig) (*Sink, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafkaevents: sink needs bootstrap servers")
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.DeliveryTimeout <= 0 {
		cfg.DeliveryTimeout = DefaultDeliveryTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(sinkClientID),
		kgo.DefaultProduceTopic(cfg.Topic),
		// franz-go's producer is idempotent unless DisableIdempotentWrite
		// is given; idempotence requires acks=all.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.MaxBufferedBytes(MaxBufferedBytes),
		kgo.MaxBufferedRecords(MaxBufferedRecords),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(librdkafkaPartition)),
		// librdkafka's producer asks for topic auto-creation by default.
		kgo.AllowAutoTopicCreation(),
	)
	if err != nil {
		return nil, fmt.Errorf("kafkaevents: new producer: %w", err)
	}
	return &Sink{cl: cl, log: cfg.Logger, warns: logthrottle.New(), topic: cfg.Topic, maxRecords: MaxBufferedRecords}, nil
}

// Publish validates every batch, then queues one record per batch in list
// order. A list with an invalid batch is refused whole before anything is
// queued. Delivery failures are reported later through DroppedBatches.
// Queued records outlive ctx's cancellation (only its values are kept):
// they are bounded by DeliveryTimeout and flushed by Close.
func (s *Sink) Publish(ctx context.Context, batches []Batch) error {
	ctx = context.WithoutCancel(ctx)
	values := make([][]byte, len(batches))
	for i, b := range batches {
		if err := b.Validate(); err != nil {
			return fmt.Errorf("kafkaevents: batch %d: %w", i, err)
		}
		v, err := Encode(b)
		if err != nil {
			return err
		}
		values[i] = v
	}
	s.produceMu.Lock()
	defer s.produceMu.Unlock()
	for i, v := range values {
		key := []byte(batches[i].InstanceID)
		// Both of the producer's caps are checked here so that a full
		// buffer refuses the rest of the list with ErrRefused; TryProduce
		// would drop the record through its promise (still counted, in
		// delivered) and let later batches of the list in behind the gap.
		// The byte cap counts key and value, as franz-go does. Deliveries
		// only lower the producer's counts, so under produceMu a record
		// that passes the check is one TryProduce buffers.
		if s.closed.Load() || s.cl.BufferedProduceRecords() >= s.maxRecords ||
			s.cl.BufferedProduceBytes()+int64(len(key)+len(v)) > MaxBufferedBytes {
			n := int64(len(values) - i)
			s.dropped.Add(n)
			return fmt.Errorf("%w: %d of %d for topic %q (buffer full or sink closed)", ErrRefused, n, len(values), s.topic)
		}
		s.cl.TryProduce(ctx, &kgo.Record{Key: key, Value: v}, s.delivered)
	}
	return nil
}

func (s *Sink) delivered(r *kgo.Record, err error) {
	if err == nil {
		s.sent.Add(1)
		return
	}
	n := s.dropped.Add(1)
	s.warns.Log(s.log, slog.LevelWarn, "undelivered", undeliveredWarnEvery, "kafka did not deliver a cache-event record",
		"instance_id", string(r.Key), "topic", r.Topic, "dropped_total", n, "err", err)
}

// Flush waits until every queued record was delivered or dropped, or ctx ends.
func (s *Sink) Flush(ctx context.Context) error {
	if err := s.cl.Flush(ctx); err != nil {
		return fmt.Errorf("kafkaevents: flush: %w", err)
	}
	return nil
}

// DroppedBatches counts batches refused by Publish or never delivered.
func (s *Sink) DroppedBatches() int64 { return s.dropped.Load() }

// DeliveredBatches counts batches the brokers acknowledged.
func (s *Sink) DeliveredBatches() int64 { return s.sent.Load() }

// Collectors exposes the sink's counters as Prometheus metrics for the
// caller to register.
func (s *Sink) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lmcache_mp_coordinator_kafka_batches_dropped_total",
			Help: "Cache-event batches the Kafka sink refused (buffer full, closed) or could not deliver within the delivery timeout."},
			func() float64 { return float64(s.dropped.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lmcache_mp_coordinator_kafka_batches_delivered_total",
			Help: "Cache-event batches the Kafka brokers acknowledged."},
			func() float64 { return float64(s.sent.Load()) }),
	}
}

// Close flushes queued records for at most CloseFlushTimeout, then closes the
// producer. Records still queued after that are dropped, counted and logged.
func (s *Sink) Close() error {
	s.produceMu.Lock()
	wasClosed := s.closed.Swap(true)
	s.produceMu.Unlock()
	if wasClosed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), CloseFlushTimeout)
	defer cancel()
	ferr := s.cl.Flush(ctx)
	if ferr != nil {
		s.log.Warn("kafka cache-event records remained queued at shutdown",
			"buffered_records", s.cl.BufferedProduceRecords(), "err", ferr)
	}
	// Close fails what is still buffered; delivered counts those as drops.
	s.cl.Close()
	if ferr != nil {
		return fmt.Errorf("kafkaevents: close: %w", ferr)
	}
	return nil
}
