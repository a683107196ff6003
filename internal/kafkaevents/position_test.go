package kafkaevents_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// seqs returns the first batch's seq of each record.
func seqs(recs []kafkaevents.Record) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.Batches[0].Seq
	}
	return out
}

// A Source given StartOffsets resumes each partition there although its
// group committed further (a checkpoint behind the commit); FromStart
// reads everything retained although the group committed it all; and
// Positions reports the next offset past every handled record.
func TestSourceResumesFromStartOffsets(t *testing.T) {
	const total = 10
	brokers, topic := newTopic(t, 1)
	sink := newSink(t, brokers, topic)
	publishEach(t, sink, []string{"mp-a"}, 1, total)

	first := newCollector()
	src1 := newSource(t, brokers, topic, "g-pos", first)
	stop1 := runSource(t, src1)
	first.wait(t, total)
	stop1()
	if got := committed(t, brokers, "g-pos", topic, 0); got != total {
		t.Fatalf("committed %d after the first consumer, want %d", got, total)
	}
	if diff := cmp.Diff(map[int32]int64{0: total}, src1.Positions()); diff != "" {
		t.Errorf("Positions after %d records (-want +got):\n%s", total, diff)
	}

	resumed := newCollector()
	src2, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: brokers, Topic: topic, GroupID: "g-pos",
		StartOffsets: map[int32]int64{0: 6}}, resumed)
	if err != nil {
		t.Fatal(err)
	}
	stop2 := runSource(t, src2)
	if diff := cmp.Diff([]int64{7, 8, 9, 10}, seqs(resumed.wait(t, 4))); diff != "" {
		t.Errorf("records after resuming at offset 6 (-want +got):\n%s", diff)
	}
	stop2()

	again := newCollector()
	src3, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: brokers, Topic: topic, GroupID: "g-pos", FromStart: true}, again)
	if err != nil {
		t.Fatal(err)
	}
	stop3 := runSource(t, src3)
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, seqs(again.wait(t, total))); diff != "" {
		t.Errorf("records with FromStart (-want +got):\n%s", diff)
	}
	stop3()
}
