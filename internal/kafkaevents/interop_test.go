package kafkaevents_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// upstreamPython is Debian's interpreter, which has python3-confluent-kafka
// (librdkafka, upstream's Kafka client; scripts/install-deps.sh test). The
// first python3 on PATH may be another one.
const upstreamPython = "/usr/bin/python3"

type pyRecord struct {
	Key       string `json:"key"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Value     string `json:"value"`
}

// runUpstream runs testdata/upstream_client.py and returns its JSON lines.
func runUpstream(t *testing.T, stdin []byte, args ...string) []pyRecord {
	t.Helper()
	if _, err := os.Stat(upstreamPython); err != nil {
		t.Fatalf("%s missing: %v", upstreamPython, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, upstreamPython, append([]string{"testdata/upstream_client.py"}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("upstream_client.py %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var recs []pyRecord
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r pyRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("upstream_client.py line %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs
}

// An upstream-style (librdkafka) producer and our Sink take turns on one
// topic for the same instances, as when an MP server is swapped between
// implementations: every record lands on the partition our partitioner
// predicts, the values are byte-identical to our encoding, and one Source
// applies each instance's seq 1..10 in order.
func TestUpstreamProducerAndSinkShareATopic(t *testing.T) {
	const partitions = 3
	brokers, topic := newTopic(t, partitions)
	instances := []string{"mp-a", "mp-b", "mp-c", "mp-d"}
	publishEach(t, newSink(t, brokers, topic), instances, 1, 5)
	var in bytes.Buffer
	for seq := int64(6); seq <= 10; seq++ {
		for _, id := range instances {
			line, err := json.Marshal(map[string]any{"key": id, "batch": storeBatch(id, seq)})
			if err != nil {
				t.Fatal(err)
			}
			in.Write(append(line, '\n'))
		}
	}
	reports := runUpstream(t, in.Bytes(), "produce", strings.Join(brokers, ","), topic)
	if len(reports) != 5*len(instances) {
		t.Fatalf("%d delivery reports, want %d", len(reports), 5*len(instances))
	}
	for _, r := range reports {
		if want := int32(kafkaevents.Partition([]byte(r.Key), partitions)); r.Partition != want {
			t.Errorf("librdkafka put %s on partition %d, our partitioner on %d", r.Key, r.Partition, want)
		}
	}

	c := newCollector()
	stop := runSource(t, newSource(t, brokers, topic, "g-interop", c))
	recs := c.wait(t, 10*len(instances))
	stop()
	next := map[string]int64{}
	for _, r := range recs {
		b := r.Batches[0]
		next[b.InstanceID]++
		if b.Seq != next[b.InstanceID] {
			t.Fatalf("%s: %s seq %d, want %d", r.Position(), b.InstanceID, b.Seq, next[b.InstanceID])
		}
		ours, err := kafkaevents.Encode(storeBatch(b.InstanceID, b.Seq))
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Value) != string(ours) {
			t.Errorf("%s: value differs from our encoding:\n got  %s\n ours %s", r.Position(), r.Value, ours)
		}
	}
}

// Records our Sink produces are read by an upstream-style (librdkafka)
// consumer with upstream's source settings: same keys, partitions our
// partitioner chose, and values that decode to the published batches.
func TestUpstreamConsumerReadsSinkRecords(t *testing.T) {
	const partitions = 3
	brokers, topic := newTopic(t, partitions)
	instances := []string{"mp-a", "mp-b", "mp-c"}
	publishEach(t, newSink(t, brokers, topic), instances, 1, 4)
	got := runUpstream(t, nil, "consume", strings.Join(brokers, ","), topic, "g-upstream-consumer", "12")
	next := map[string]int64{}
	for _, r := range got {
		if want := int32(kafkaevents.Partition([]byte(r.Key), partitions)); r.Partition != want {
			t.Errorf("%s on partition %d, want %d", r.Key, r.Partition, want)
		}
		env, err := kafkaevents.Decode([]byte(r.Value))
		if err != nil {
			t.Fatal(err)
		}
		next[r.Key]++
		if diff := cmp.Diff([]kafkaevents.Batch{storeBatch(r.Key, next[r.Key])}, env.Batches); diff != "" {
			t.Errorf("%s@%d (-want +got):\n%s", r.Key, r.Offset, diff)
		}
	}
	for _, id := range instances {
		if next[id] != 4 {
			t.Errorf("%s: %d records read, want 4", id, next[id])
		}
	}
	// The upstream consumer's close committed what it stored.
	var total int64
	for p := int32(0); p < partitions; p++ {
		if c := committed(t, brokers, "g-upstream-consumer", topic, p); c > 0 {
			total += c
		}
	}
	if total != 12 {
		t.Errorf("upstream consumer committed %d records, want 12", total)
	}
}
