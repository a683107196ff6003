package coordinator

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// Names of the Kafka loops in the periodic registry.
const (
	LoopKafkaIngest = "coordinator-kafka-ingest"
	LoopKafkaLag    = "coordinator-kafka-lag"
)

// kafkaPoll bounds one poll of the ingest worker (one cycle) and is the lag
// refresh interval.
const kafkaPoll = time.Second

// kafkaIngest is the coordinator's Kafka event door (--event-transport
// kafka): a kafkaevents.Source whose records go through IngestCacheEvents,
// the gate POST /events uses in http mode, and the readiness it derives from
// the stream's lag.
type kafkaIngest struct {
	src    *kafkaevents.Source
	maxLag int64
	// lag is the last measured lag (kafkaevents.UnknownLag until measured).
	lag atomic.Int64
	// ready is closed once lag was at or below maxLag; the eviction and
	// resync loops wait for it (upstream's IngestReadiness).
	ready     chan struct{}
	readyOnce sync.Once
	// short counts consecutive lag cycles in which the consumer held
	// fewer partitions than the topic has, and warned is whether this
	// run of them was logged (only the lag loop touches either).
	short  int64
	warned bool
}

// sharedGroupCycles is how many lag cycles (seconds) in a row the consumer
// may hold fewer than all of the topic's partitions before the lag loop
// warns that its group is shared: longer than a rebalance, and than a
// restart's wait for its dead predecessor's session to time out (10 s),
// so a member joining or leaving does not trip it. Atomic so a test can
// change it while the loop runs.
var sharedGroupCycles atomic.Int64

func init() { sharedGroupCycles.Store(30) }

// newKafkaIngest builds the Source; start (nil: the group's commit, or the
// earliest offset) and fromStart come from the checkpoint.
func (s *Server) newKafkaIngest(start map[int32]int64, fromStart bool) error {
	if s.ha != nil {
		// Set once, before anything runs: the Source, the start log
		// line and /config all read the group this coordinator joins.
		if g := s.cfg.KafkaGroup(s.ha.id); g != s.cfg.Ingest.KafkaGroupID {
			s.log.Info("HA mode: consuming the cache-event topic in this coordinator's own group, so its ledger sees every partition", "group_id", g, "id", s.ha.id)
			s.cfg.Ingest.KafkaGroupID = g
		}
	}
	in := s.cfg.Ingest
	src, err := kafkaevents.NewSource(kafkaevents.SourceConfig{
		Brokers: in.KafkaBrokers(), Topic: in.KafkaTopic, GroupID: in.KafkaGroupID, Logger: s.log,
		StartOffsets: start, FromStart: fromStart,
	}, kafkaevents.ApplierFunc(s.applyKafkaRecord))
	if err != nil {
		return fmt.Errorf("kafka ingest: %w", err)
	}
	k := &kafkaIngest{src: src, maxLag: int64(in.MaxReadyLag), ready: make(chan struct{})}
	k.lag.Store(kafkaevents.UnknownLag)
	s.kafka = k
	return nil
}

// applyKafkaRecord offers one record's batches to the event gate. A body the
// HTTP door would refuse (422) can never apply, so it is rejected and the
// Source moves past it; nothing else fails.
func (s *Server) applyKafkaRecord(_ context.Context, rec kafkaevents.Record) error {
	applied, dups, stale, err := s.IngestCacheEvents(rec.Value)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", kafkaevents.ErrRejected, rec.Position(), err)
	}
	s.log.Debug("kafka cache-event record applied", "position", rec.Position(), "applied", applied, "duplicates", dups, "stale", stale)
	return nil
}

// kafkaLoops returns the ingest worker and the lag loop for Run. The worker
// owns the consumer: it opens it, polls once per cycle (each cycle waits at
// most kafkaPoll, so an idle stream still completes cycles) and closes it
// when ctx ends, after the last commit.
func (s *Server) kafkaLoops(ctx context.Context) []func() {
	k := s.kafka
	worker := s.loops.RegisterWorker(LoopKafkaIngest, periodic.High, kafkaPoll, func(ctx context.Context) (periodic.Summary, error) {
		n, err := k.src.Poll(ctx, kafkaPoll)
		if err != nil {
			return periodic.Summary{}, fmt.Errorf("kafka ingest: %w", err)
		}
		return periodic.Summary{Message: fmt.Sprintf("records=%d", n)}, nil
	})
	lag := s.loops.Register(LoopKafkaLag, periodic.Medium, kafkaPoll, 0, func(ctx context.Context) (periodic.Summary, error) {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := k.src.Lag(lctx)
		k.lag.Store(n)
		if err != nil {
			return periodic.Summary{Message: "lag=unknown"}, err
		}
		if n <= k.maxLag {
			k.readyOnce.Do(func() {
				s.log.Info("kafka ingest caught up; eviction and resync may start", "lag", n, "max_ready_lag", k.maxLag)
				close(k.ready)
			})
		}
		held, total := k.src.Assignment()
		if held < total {
			k.short++
		} else {
			k.short, k.warned = 0, false
		}
		if k.short >= sharedGroupCycles.Load() && !k.warned {
			// Once per run of short cycles; a cycle with every partition
			// ends the run.
			k.warned = true
			s.log.Warn("the cache-event consumer group is shared, or this coordinator's consumer never joined it: it holds only some of the topic's partitions and its ledger misses the other partitions' events; give each coordinator its own --kafka-group-id (or see the kafka ingest errors logged before)",
				"group_id", s.cfg.Ingest.KafkaGroupID, "partitions_held", held, "topic_partitions", total, "for_cycles", k.short)
		}
		return periodic.Summary{Message: fmt.Sprintf("lag=%d partitions=%d/%d", n, held, total)}, nil
	})
	return []func(){
		func() {
			if err := k.src.Open(); err != nil {
				s.log.Error("kafka ingest cannot start", "err", err)
				return
			}
			defer k.src.Close()
			s.log.Info("kafka ingest started", "topic", k.src.Topic(), "group_id", s.cfg.Ingest.KafkaGroupID, "brokers", s.cfg.Ingest.KafkaBootstrapServers)
			worker.Run(ctx)
		},
		func() { lag.Run(ctx) },
	}
}

// afterIngestReady wraps a loop body so that, in kafka mode, it starts only
// once the stream's lag is within --max-ready-lag: planning evictions
// against half-replayed usage would evict what the fleet does not need. An
// unknown lag (brokers unreachable) keeps it waiting, as upstream.
func (s *Server) afterIngestReady(ctx context.Context, run func()) func() {
	if s.kafka == nil {
		return run
	}
	return func() {
		select {
		case <-s.kafka.ready:
			run()
		case <-ctx.Done():
		}
	}
}

// kafkaCollectors are the Source's counters and the lag and readiness
// gauges.
func (s *Server) kafkaCollectors() []prometheus.Collector {
	k := s.kafka
	return append(k.src.Collectors(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "kafka_lag", Help: "Records of the cache-event topic still to apply, summed over partitions (-1: unknown, brokers unreachable)."},
			func() float64 { return float64(k.lag.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "kafka_ready", Help: "1 once the Kafka lag was within --max-ready-lag (eviction and resync started)."},
			func() float64 {
				select {
				case <-k.ready:
					return 1
				default:
					return 0
				}
			}),
	)
}
