package kafkaevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
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
	// sessionTimeout is the consumer group session (see Open).
	sessionTimeout = 10 * time.Second
	retryInitial   = 100 * time.Millisecond
	retryMax       = 5 * time.Second
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
	// StartOffsets, when non-nil, is where the stream resumes: the next
	// offset to read for each partition of Topic (a checkpoint's stream
	// position). On every assignment a partition the Source has a position
	// for (from here, or from records it has handled since) is seeked
	// there instead of to the group's committed offset, which can be ahead
	// of the state a checkpoint restored; upstream's StreamPosition.
	StartOffsets map[int32]int64
	// FromStart makes an assigned partition the Source has no position for
	// start at the earliest retained offset rather than the group's
	// committed one: the state it feeds starts empty (no checkpoint, or a
	// bad one moved aside), so everything retained must be read again.
	FromStart bool
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

	applied, undecodable, rejected, retries, consumerErrors, commitErrors, lost atomic.Int64

	// crashed makes Run return without its final commit (tests simulate a
	// crash with it; see export_test.go).
	crashed atomic.Bool
	// pollRecords overrides maxPollRecords in tests.
	pollRecords int

	// cl is the consumer between Open and Close; only the goroutine that
	// calls Open, Poll and Close uses it. live is the same client for Lag,
	// which runs on other goroutines and reuses its connections.
	cl   *kgo.Client
	live atomic.Pointer[kgo.Client]

	// posMu guards pos: the next offset to read per partition, advanced
	// after a record is handled (applied, rejected or undecodable), read by
	// Positions (a checkpoint) and Lag from other goroutines.
	posMu sync.Mutex
	pos   map[int32]int64

	// assigned is how many of the topic's partitions the group gives this
	// consumer (kept by the group callbacks, see Open); partitions is the
	// topic's partition count as of the last Lag, -1 before one answered.
	// Fewer assigned than there are means another consumer shares the
	// group and gets the others' records (see Assignment).
	assigned, partitions atomic.Int64
}

// SourceStats are the Source's counters.
type SourceStats struct {
	Applied        int64 // records Apply accepted
	Undecodable    int64 // records skipped because they did not decode
	Rejected       int64 // records skipped because Apply returned ErrRejected
	ApplyRetries   int64 // transient Apply failures retried
	ConsumerErrors int64 // fetch errors reported by the client
	CommitErrors   int64 // offset commits that failed (records redelivered later)
	// RecordsLost counts records lost to the stream: skipped unread
	// because retention or DeleteRecords removed them first, or spanned by
	// franz-go's data-loss reports (kgo.ErrDataLoss: the broker lost
	// records the consumer had read; each report is also a ConsumerError).
	RecordsLost int64
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
	pos := maps.Clone(cfg.StartOffsets)
	if pos == nil {
		pos = map[int32]int64{}
	}
	src := &Source{cfg: cfg, app: app, log: cfg.Logger, pollRecords: maxPollRecords, pos: pos}
	src.partitions.Store(-1)
	return src, nil
}

// Assignment reports how many partitions of the topic this consumer holds
// and how many the topic has (-1 until a Lag call learned it). A consumer
// that holds fewer than all of them for longer than a rebalance shares its
// group with another consumer, which reads the rest: the state this Source
// feeds then misses those partitions' events.
func (s *Source) Assignment() (assigned, partitions int) {
	return int(s.assigned.Load()), int(s.partitions.Load())
}

// countPartitions adds the topic's partitions in a group callback's set,
// times sign (+1 assigned, -1 revoked or lost).
func (s *Source) countPartitions(sign int64) func(context.Context, *kgo.Client, map[string][]int32) {
	return func(_ context.Context, _ *kgo.Client, set map[string][]int32) {
		s.assigned.Add(sign * int64(len(set[s.cfg.Topic])))
	}
}

// Topic is the topic the Source consumes.
func (s *Source) Topic() string { return s.cfg.Topic }

// Positions returns the next offset to read per partition: past every record
// the Source has handled, or where StartOffsets put it. A position is
// advanced only after the Applier returned, so state captured together with
// it (under the Applier's own lock) never lags behind it: resuming there
// replays at most records already applied, which the event gate drops as
// duplicates.
func (s *Source) Positions() map[int32]int64 {
	s.posMu.Lock()
	defer s.posMu.Unlock()
	return maps.Clone(s.pos)
}

// advance moves r's partition's position past r. It also moves it back: a
// partition's records arrive in offset order from where adjustOffsets
// seeked it, so a record below the position means the consumer reset to
// the log start (the position was past the end: the topic was created
// again, or the checkpoint is another cluster's), and keeping the stale
// position would make Lag read 0 over unread records and be checkpointed
// again.
//
// A record past the position means the records between were never read:
// retention or DeleteRecords removed them first (the consumer fell below
// the log start, or a checkpoint's position is below it) and franz-go
// resumed at the log start without reporting an error. They are counted as
// lost. (A compacted or transactional topic has such gaps too; the
// cache-event topic is neither.)
func (s *Source) advance(r *kgo.Record) {
	s.posMu.Lock()
	next, ok := s.pos[r.Partition]
	s.pos[r.Partition] = r.Offset + 1
	s.posMu.Unlock()
	if ok && r.Offset > next {
		n := r.Offset - next
		s.lost.Add(n)
		s.log.Warn("kafka cache-event records were removed before the consumer read them", "topic", r.Topic,
			"partition", r.Partition, "from_offset", next, "to_offset", r.Offset, "records_lost", n)
	}
}

// dataLoss is how many records a data-loss report spans. Reset back
// (the broker's log ends or diverged before where the consumer was), the
// records from ResetTo to ConsumedTo were lost after the consumer read them;
// where franz-go could not locate the divergence, ConsumeResetOffset (the
// log start) chose ResetTo and this is an upper bound. A reset forward
// skips records unread, which advance counts when the next record arrives.
func dataLoss(dl *kgo.ErrDataLoss) int64 {
	return max(dl.ConsumedTo-dl.ResetTo, 0)
}

// adjustOffsets seeks newly assigned partitions to the Source's positions
// (see SourceConfig.StartOffsets and FromStart).
func (s *Source) adjustOffsets(_ context.Context, assigned map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	s.posMu.Lock()
	defer s.posMu.Unlock()
	for topic, parts := range assigned {
		if topic != s.cfg.Topic {
			continue
		}
		for p := range parts {
			switch next, ok := s.pos[p]; {
			case ok:
				parts[p] = kgo.NewOffset().At(next)
			case s.cfg.FromStart:
				parts[p] = kgo.NewOffset().AtStart()
			}
		}
	}
	return assigned, nil
}

// Stats returns a snapshot of the counters.
func (s *Source) Stats() SourceStats {
	return SourceStats{Applied: s.applied.Load(), Undecodable: s.undecodable.Load(), Rejected: s.rejected.Load(),
		ApplyRetries: s.retries.Load(), ConsumerErrors: s.consumerErrors.Load(), CommitErrors: s.commitErrors.Load(),
		RecordsLost: s.lost.Load()}
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
		c("records_lost_total", "Kafka cache-event records lost to the stream: removed by retention (or DeleteRecords) before the consumer read them, or lost by the broker after it read them (the client's data-loss reports; an upper bound where it could not locate the loss).", &s.lost),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lmcache_coordinator_kafka_partitions_assigned",
			Help: "Partitions of the cache-event topic this coordinator's consumer holds; below lmcache_coordinator_kafka_topic_partitions after a rebalance, another consumer shares its group and this ledger misses the rest."},
			func() float64 { return float64(s.assigned.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lmcache_coordinator_kafka_topic_partitions",
			Help: "Partitions of the cache-event topic (-1 until the lag loop first reached the brokers)."},
			func() float64 { return float64(s.partitions.Load()) }),
	}
}

// Run consumes until ctx is cancelled, then commits what was applied and
// leaves the group. It returns nil on cancellation and an error only when the
// client cannot be built.
func (s *Source) Run(ctx context.Context) error {
	if err := s.Open(); err != nil {
		return err
	}
	defer s.Close()
	for ctx.Err() == nil {
		if _, err := s.Poll(ctx, time.Second); err != nil {
			return nil
		}
	}
	return nil
}

// Open builds the consumer; it joins the group on the first Poll. Open,
// Poll and Close must be called from one goroutine (a periodic worker).
func (s *Source) Open() error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ClientID(sourceClientID),
		kgo.ConsumerGroup(s.cfg.GroupID),
		kgo.ConsumeTopics(s.cfg.Topic),
		// auto.offset.reset=earliest.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Offsets are committed by Poll, only past applied records.
		kgo.DisableAutoCommit(),
		// No revoke can land between applying a poll's records and
		// committing them, so a partition moving to another member never
		// skips an applied-but-uncommitted record's commit nor commits an
		// unapplied one.
		kgo.BlockRebalanceOnPoll(),
		kgo.AdjustFetchOffsetsFn(s.adjustOffsets),
		// Both eager and cooperative rebalances hand these callbacks the
		// partitions that change hands, so the running sum is the current
		// assignment.
		kgo.OnPartitionsAssigned(s.countPartitions(1)),
		kgo.OnPartitionsRevoked(s.countPartitions(-1)),
		kgo.OnPartitionsLost(s.countPartitions(-1)),
		// A coordinator killed with SIGKILL never leaves its group: its
		// partitions stay assigned to the dead member until the session
		// times out, and a restart in the same group reads nothing until
		// then. 10 s (librdkafka and franz-go default to 45 s) bounds that
		// wait; heartbeats every second keep a live member well inside it.
		kgo.SessionTimeout(sessionTimeout),
		kgo.HeartbeatInterval(time.Second),
	)
	if err != nil {
		return fmt.Errorf("kafkaevents: new consumer: %w", err)
	}
	s.cl = cl
	s.live.Store(cl)
	return nil
}

// Close leaves the group and closes the consumer (after Open).
func (s *Source) Close() {
	if s.cl != nil {
		s.live.Store(nil)
		s.cl.CloseAllowingRebalance()
		s.cl = nil
	}
}

// errClosed is Poll's answer once the client is closed.
var errClosed = errors.New("kafkaevents: source closed")

// Poll waits up to wait for records, hands each to the Applier in partition
// order and commits past the ones handled. It returns how many records it
// handled; an error only when the client is closed (or Open was not
// called). When ctx is cancelled mid-poll it still commits what it applied.
func (s *Source) Poll(ctx context.Context, wait time.Duration) (int, error) {
	cl := s.cl
	if cl == nil {
		return 0, errClosed
	}
	pctx, cancel := context.WithTimeout(ctx, wait)
	fetches := cl.PollRecords(pctx, s.pollRecords)
	cancel()
	if fetches.IsClientClosed() {
		return 0, errClosed
	}
	fetches.EachError(func(topic string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		s.consumerErrors.Add(1)
		if dl, ok := errors.AsType[*kgo.ErrDataLoss](err); ok {
			// The records between where the consumer was and where the
			// client reset it are the loss; one error count alone
			// would not say whether one record or a million went.
			n := dataLoss(dl)
			s.lost.Add(n)
			s.log.Warn("kafka lost cache-event records under the consumer", "topic", topic, "partition", p,
				"consumed_to", dl.ConsumedTo, "reset_to", dl.ResetTo, "records_lost", n, "err", err)
			return
		}
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
		s.advance(r)
		done = append(done, r)
	})
	if ctx.Err() != nil && s.crashed.Load() {
		return len(done), nil
	}
	s.commit(ctx, cl, done)
	cl.AllowRebalance()
	return len(done), nil
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
