package kafkaevents_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
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
