package kafkaevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	sourceClientID = "lmcache-coordinator"
	// maxPollRecords bounds one poll so a commit follows every few hundred
	// applied records even on a deep backlog.
	maxPollRecords = 500
	// commitTimeout bounds the final commit on a clean stop.
	commitTimeout = 10 * time.Second
	retryInitial  = 100 * time.Millisecond
	retryMax      = 5 * time.Second
)

// ErrRejected, wrapped in an Applier's error, says the record can never be
// applied (resending it cannot help): the Source counts it, logs it and moves
// past it (its offset is committed), as upstream skips a record whose
// consumers raise. Any other error is treated as transient and retried.
var ErrRejected = errors.New("cache-event record rejected")

// Record is one decoded Kafka record, handed to an Applier.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	// Key is the producer's key: the emitter's instance_id.
	Key []byte
	// Value is the record's raw value (a POST /events body), for an Applier
	// that decodes with the HTTP door's own decoder.
	Value   []byte
	Batches []Batch
}

// Position names a record as "topic[partition]@offset" for logs.
func (r Record) Position() string {
	return fmt.Sprintf("%s[%d]@%d", r.Topic, r.Partition, r.Offset)
}

// Applier admits a decoded record (the coordinator's event gate). Apply is
// called from the Source's one poll goroutine, in partition order; a nil
// return means the record's effects are applied and its offset may be
// committed.
type Applier interface {
	Apply(ctx context.Context, rec Record) error
}

// ApplierFunc adapts a function to Applier.
type ApplierFunc func(ctx context.Context, rec Record) error

// Apply calls f.
func (f ApplierFunc) Apply(ctx context.Context, rec Record) error { return f(ctx, rec) }

// SourceConfig configures a Source.
type SourceConfig struct {
	// Brokers are the bootstrap servers (--kafka-bootstrap-servers).
	Brokers []string
	// Topic defaults to DefaultTopic (--kafka-topic).
	Topic string
	// GroupID defaults to DefaultGroupID (--kafka-group-id).
	GroupID string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Source consumes cache-event records from a topic as a member of a consumer
// group, starting from the earliest offset when the group has none. It hands
// every decodable record to its Applier and commits a partition's offset only
// past records Apply accepted (at-least-once). Undecodable records are counted
// and skipped. Run owns the Kafka client and its goroutines.
type Source struct {
	cfg SourceConfig
	app Applier
	log *slog.Logger

	applied, undecodable, rejected, retries, consumerErrors, commitErrors atomic.Int64

	// crashed makes Run return without its final commit (tests simulate a
	// crash with it; see export_test.go).
	crashed atomic.Bool
	// pollRecords overrides maxPollRecords in tests.
	pollRecords int
}

// SourceStats are the Source's counters.
type SourceStats struct {
	Applied        int64 // records Apply accepted
	Undecodable    int64 // records skipped because they did not decode
	Rejected       int64 // records skipped because Apply returned ErrRejected
	ApplyRetries   int64 // transient Apply failures retried
	ConsumerErrors int64 // fetch errors reported by the client
	CommitErrors   int64 // offset commits that failed (records redelivered later)
}

// NewSource validates cfg. Nothing connects until Run.
func NewSource(cfg SourceConfig, app Applier) (*Source, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafkaevents: source needs bootstrap servers")
	}
	if app == nil {
		return nil, errors.New("kafkaevents: source needs an Applier")
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.GroupID == "" {
		cfg.GroupID = DefaultGroupID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Source{cfg: cfg, app: app, log: cfg.Logger, pollRecords: maxPollRecords}, nil
}

// Stats returns a snapshot of the counters.
func (s *Source) Stats() SourceStats {
	return SourceStats{Applied: s.applied.Load(), Undecodable: s.undecodable.Load(), Rejected: s.rejected.Load(),
		ApplyRetries: s.retries.Load(), ConsumerErrors: s.consumerErrors.Load(), CommitErrors: s.commitErrors.Load()}
}

// Collectors exposes the counters as Prometheus metrics for the caller to
// register.
func (s *Source) Collectors() []prometheus.Collector {
	c := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lmcache_coordinator_kafka_" + name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		c("records_applied_total", "Kafka cache-event records the event gate accepted.", &s.applied),
		c("records_undecodable_total", "Kafka cache-event records skipped because they did not decode (dropped, offset committed).", &s.undecodable),
		c("records_rejected_total", "Kafka cache-event records skipped because the event gate rejected them (dropped, offset committed).", &s.rejected),
		c("apply_retries_total", "Transient event-gate failures on a Kafka record, retried with backoff.", &s.retries),
		c("consumer_errors_total", "Fetch errors reported by the Kafka consumer.", &s.consumerErrors),
		c("commit_errors_total", "Offset commits that failed; the records after the last good commit are redelivered.", &s.commitErrors),
	}
}

// Run consumes until ctx is cancelled, then commits what was applied and
// leaves the group. It returns nil on cancellation and an error only when the
// client cannot be built.
func (s *Source) Run(ctx context.Context) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ClientID(sourceClientID),
		kgo.ConsumerGroup(s.cfg.GroupID),
		kgo.ConsumeTopics(s.cfg.Topic),
		// auto.offset.reset=earliest.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Offsets are committed by Run, only past applied records.
		kgo.DisableAutoCommit(),
		// No revoke can land between applying a poll's records and
		// committing them, so a partition moving to another member never
		// skips an applied-but-uncommitted record's commit nor commits an
		// unapplied one.
		kgo.BlockRebalanceOnPoll(),
	)
	if err != nil {
		return fmt.Errorf("kafkaevents: new consumer: %w", err)
	}
	defer cl.CloseAllowingRebalance()
	for {
		fetches := cl.PollRecords(ctx, s.pollRecords)
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			s.consumerErrors.Add(1)
			s.log.Warn("kafka cache-event consumer error", "topic", topic, "partition", p, "err", err)
		})
		var done []*kgo.Record
		stopped := false
		fetches.EachRecord(func(r *kgo.Record) {
			if stopped {
				return
			}
			if err := s.handle(ctx, r); err != nil {
				stopped = true
				return
			}
			done = append(done, r)
		})
		if ctx.Err() != nil && s.crashed.Load() {
			return nil
		}
		s.commit(ctx, cl, done)
		if ctx.Err() != nil {
			return nil
		}
		cl.AllowRebalance()
	}
}

// commit commits past the applied records. It outlives ctx's cancellation
// (bounded by commitTimeout) so a clean stop keeps what it applied.
func (s *Source) commit(ctx context.Context, cl *kgo.Client, done []*kgo.Record) {
	if len(done) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := cl.CommitRecords(cctx, done...); err != nil {
		s.commitErrors.Add(1)
		s.log.Warn("kafka cache-event offset commit failed; records will be redelivered", "records", len(done), "err", err)
	}
}

// handle decodes r and applies it, retrying transient failures. It returns
// an error only when ctx ended before the record was applied.
func (s *Source) handle(ctx context.Context, r *kgo.Record) error {
	rec := Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
	env, err := Decode(r.Value)
	if err != nil {
		s.undecodable.Add(1)
		s.log.Warn("dropping undecodable cache-event record", "position", rec.Position(), "err", err)
		return nil
	}
	rec.Batches = env.Batches
	backoff := retryInitial
	for {
		err := s.app.Apply(ctx, rec)
		switch {
		case err == nil:
			s.applied.Add(1)
			return nil
		case errors.Is(err, ErrRejected):
			s.rejected.Add(1)
			s.log.Warn("dropping rejected cache-event record", "position", rec.Position(), "err", err)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
		s.retries.Add(1)
		s.log.Warn("cache-event record not applied; retrying", "position", rec.Position(), "backoff", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, retryMax)
	}
}
