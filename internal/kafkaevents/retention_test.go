package kafkaevents_test

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/logtest"
)

// Records below a partition's log start offset (removed by retention, or
// by DeleteRecords as here) can never be read: the consumer resets past
// them. Lag must not count them, whether the position behind them is the
// group's commit or the Source's own (a checkpoint's StartOffsets);
// otherwise an idle partition reads as lagging forever and the coordinator's
// --max-ready-lag gate never opens.
func TestSourceLagIgnoresRecordsBelowTheLogStart(t *testing.T) {
	brokers, topic := newTopic(t, 1)
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 1, 5)
	cl, ctx := adminClient(t, brokers)
	adm := kadm.NewClient(cl)
	var commit kadm.Offsets
	commit.AddOffset(topic, 0, 2, -1)
	if resps, err := adm.CommitOffsets(ctx, "g-retained", commit); err != nil || resps.Error() != nil {
		t.Fatalf("commit offset 2: %v %v", err, resps.Error())
	}
	var before kadm.Offsets
	before.AddOffset(topic, 0, 5, -1)
	if resps, err := adm.DeleteRecords(ctx, before); err != nil || resps.Error() != nil {
		t.Fatalf("delete records before offset 5: %v %v", err, resps.Error())
	}

	committed := newSource(t, brokers, topic, "g-retained", newCollector())
	if lag, err := committed.Lag(ctx); err != nil || lag != 0 {
		t.Errorf("lag with the group committed at 2 and the log starting at 5 (end 5): %d %v, want 0", lag, err)
	}
	checkpoint, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: brokers, Topic: topic, GroupID: "g-none",
		StartOffsets: map[int32]int64{0: 1}}, newCollector())
	if err != nil {
		t.Fatal(err)
	}
	if lag, err := checkpoint.Lag(ctx); err != nil || lag != 0 {
		t.Errorf("lag with a checkpoint at 1 and the log starting at 5 (end 5): %d %v, want 0", lag, err)
	}
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 6, 7)
	if lag, err := checkpoint.Lag(ctx); err != nil || lag != 2 {
		t.Errorf("lag after 2 more records: %d %v, want 2 (only the retained ones)", lag, err)
	}
}

// A checkpoint's position past a partition's end (the topic was deleted and
// created again, or the checkpoint came from another cluster) makes the
// consumer reset to the earliest offset. Positions must then follow the
// records actually read, not stay at the stale position: otherwise Lag reads
// 0 while the new records are still unread (the readiness gate opens early)
// and the next checkpoint stores the stale position again.
func TestSourcePositionsFollowAResetBelowTheCheckpoint(t *testing.T) {
	brokers, topic := newTopic(t, 1)
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 1, 3)
	c := newCollector()
	src, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: brokers, Topic: topic, GroupID: "g-reset",
		StartOffsets: map[int32]int64{0: 50}}, c)
	if err != nil {
		t.Fatal(err)
	}
	stop := runSource(t, src)
	if diff := cmp.Diff([]int64{1, 2, 3}, seqs(c.wait(t, 3))); diff != "" {
		t.Fatalf("records after the reset from offset 50 (-want +got):\n%s", diff)
	}
	stop()
	if diff := cmp.Diff(map[int32]int64{0: 3}, src.Positions()); diff != "" {
		t.Errorf("Positions after reading offsets 0..2 (-want +got):\n%s", diff)
	}
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 4, 5)
	_, ctx := adminClient(t, brokers)
	if lag, err := src.Lag(ctx); err != nil || lag != 2 {
		t.Errorf("lag with 2 unread records: %d %v, want 2", lag, err)
	}
}

// fetchesFrom reports whether req is a fetch asking for some partition at
// offset or past it.
func fetchesFrom(req kmsg.Request, offset int64) bool {
	f, ok := req.(*kmsg.FetchRequest)
	if !ok {
		return false
	}
	for _, t := range f.Topics {
		for _, p := range t.Partitions {
			if p.FetchOffset >= offset {
				return true
			}
		}
	}
	return false
}

// lostSource is a Source on a one-partition topic of a single-broker kfake
// cluster, logging to logs; control runs before the Source starts.
func lostSource(t *testing.T, topic string, logs *logtest.Buffer, control func(*kfake.Cluster)) (*kfake.Cluster, *kafkaevents.Source, *collector) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	control(c)
	coll := newCollector()
	src, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: c.ListenAddrs(), Topic: topic, GroupID: "g-lost",
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, coll)
	if err != nil {
		t.Fatal(err)
	}
	return c, src, coll
}

// lostMetric is the Source's exported lost-records counter.
func lostMetric(t *testing.T, src *kafkaevents.Source) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(src.Collectors()...)
	return gathered(t, reg, "lmcache_coordinator_kafka_records_lost_total")
}

// Records removed by retention (DeleteRecords here) after the consumer read
// up to them but before it read them are lost to the coordinator's ledger:
// franz-go resumes at the new log start without reporting an error, so the
// Source counts the records it skipped over (offsets 5..7), in its stats and
// the exported counter, and logs them.
//
// This test needs to hold fetch requests, which only the in-process kfake
// cluster can do, so it does not run against LMCACHE_TEST_KAFKA_BROKERS.
func TestSourceCountsRecordsRetentionRemovedBeforeTheyWereRead(t *testing.T) {
	const topic = "retained"
	held, release := make(chan struct{}), make(chan struct{})
	var holding atomic.Bool
	var logs logtest.Buffer
	c, src, coll := lostSource(t, topic, &logs, func(c *kfake.Cluster) {
		// The consumer's first fetch past offset 4 waits until the
		// records after it are written and partly deleted.
		c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if fetchesFrom(req, 5) && !holding.Swap(true) {
				close(held)
				c.SleepControl(func() { <-release })
			}
			return nil, nil, false
		})
	})
	defer close(release)
	brokers := c.ListenAddrs()
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 1, 5)
	stop := runSource(t, src)
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5}, seqs(coll.wait(t, 5))); diff != "" {
		t.Fatalf("records before the deletion (-want +got):\n%s", diff)
	}
	select {
	case <-held:
	case <-time.After(waitFor):
		t.Fatal("the consumer never fetched past offset 4")
	}
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 6, 10)
	if err := c.DeleteRecords(topic, 0, 8); err != nil {
		t.Fatal(err)
	}
	release <- struct{}{}
	if diff := cmp.Diff([]int64{9, 10}, seqs(coll.wait(t, 2))); diff != "" {
		t.Fatalf("records after the deletion (-want +got):\n%s", diff)
	}
	stop()
	// No consumer error: franz-go reports no loss when it resumes at the
	// log start.
	if diff := cmp.Diff(kafkaevents.SourceStats{Applied: 7, RecordsLost: 3}, src.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if got := lostMetric(t, src); got != 3 {
		t.Errorf("lmcache_coordinator_kafka_records_lost_total = %v, want 3", got)
	}
	if !logs.Has("records_lost=3") {
		t.Errorf("no WARN with records_lost=3 in:\n%s", logs.String())
	}
}

// A data-loss report of the client (kgo.ErrDataLoss: the broker answered
// OFFSET_OUT_OF_RANGE for an offset within its log, so it lost records at a
// point the client cannot locate) counts the records between where the
// consumer was and where the client reset it (offset 5 back to the log
// start, 0: an upper bound), not just one consumer error.
//
// This test injects a broker error, which only the in-process kfake cluster
// can do, so it does not run against LMCACHE_TEST_KAFKA_BROKERS.
func TestSourceCountsTheRecordsADataLossReportSpans(t *testing.T) {
	const topic = "lossy"
	var logs logtest.Buffer
	var fault *kfake.FaultHandle
	c, src, coll := lostSource(t, topic, &logs, func(c *kfake.Cluster) {
		fault = c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: topic, Err: kerr.OffsetOutOfRange,
			When: func(req kmsg.Request) bool { return fetchesFrom(req, 5) }})
	})
	publishEach(t, newSink(t, c.ListenAddrs(), topic), []string{"mp-a"}, 1, 5)
	stop := runSource(t, src)
	// Read once, then again from the log start after the reset.
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 1, 2, 3, 4, 5}, seqs(coll.wait(t, 10))); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}
	stop()
	if n := fault.Hits(); n != 1 {
		t.Fatalf("the fault answered %d fetches, want 1", n)
	}
	if diff := cmp.Diff(kafkaevents.SourceStats{Applied: 10, ConsumerErrors: 1, RecordsLost: 5}, src.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if got := lostMetric(t, src); got != 5 {
		t.Errorf("lmcache_coordinator_kafka_records_lost_total = %v, want 5", got)
	}
	if !logs.Has("records_lost=5") {
		t.Errorf("no WARN with records_lost=5 in:\n%s", logs.String())
	}
}
