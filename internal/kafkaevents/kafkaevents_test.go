package kafkaevents_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/polltest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

const waitFor = 60 * time.Second

func storeBatch(instance string, seq int64) kafkaevents.Batch {
	return kafkaevents.Batch{
		InstanceID: instance, Incarnation: 1, Seq: seq, EventType: kafkaevents.EventStore,
		Tier: kafkaevents.TierL2, Backend: "fs", TS: kafkaevents.PyFloat(1764620000 + float64(seq)),
		Entries: []kafkaevents.Entry{{
			Key:       objkey.Encoded{ChunkHashHex: fmt.Sprintf("%064x", seq), ModelName: "m", KVRank: 0},
			SizeBytes: 100 * seq, TokenIDs: []int64{seq, seq + 1}, TokenOffset: 256 * (seq - 1),
		}},
	}
}

// collector records every applied record and signals each on a channel.
type collector struct {
	mu   sync.Mutex
	recs []kafkaevents.Record
	got  chan kafkaevents.Record
}

func newCollector() *collector { return &collector{got: make(chan kafkaevents.Record, 1024)} }

func (c *collector) Apply(_ context.Context, rec kafkaevents.Record) error {
	c.mu.Lock()
	c.recs = append(c.recs, rec)
	c.mu.Unlock()
	c.got <- rec
	return nil
}

// wait returns the next n applied records or fails at the deadline.
func (c *collector) wait(t *testing.T, n int) []kafkaevents.Record {
	t.Helper()
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	var out []kafkaevents.Record
	for len(out) < n {
		select {
		case r := <-c.got:
			out = append(out, r)
		case <-deadline.C:
			t.Fatalf("applied %d of %d records before the deadline", len(out), n)
		}
	}
	return out
}

// runSource starts src.Run and returns a stop func that cancels and waits.
func runSource(t *testing.T, src *kafkaevents.Source) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(waitFor):
				t.Errorf("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newSink(t *testing.T, brokers []string, topic string) *kafkaevents.Sink {
	t.Helper()
	s, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: brokers, Topic: topic, DeliveryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// publishEach publishes storeBatch(id, seq) for seq in [from, to], each
// instance in turn, one Publish per batch, and waits for delivery.
func publishEach(t *testing.T, sink *kafkaevents.Sink, instances []string, from, to int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for seq := from; seq <= to; seq++ {
		for _, id := range instances {
			if err := sink.Publish(ctx, []kafkaevents.Batch{storeBatch(id, seq)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sink.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func newSource(t *testing.T, brokers []string, topic, group string, app kafkaevents.Applier) *kafkaevents.Source {
	t.Helper()
	src, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: brokers, Topic: topic, GroupID: group}, app)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// Every batch three emitters publish through the Sink reaches the Applier,
// each emitter's batches in seq order, each record keyed by its instance_id
// on the partition librdkafka's partitioner would pick.
func TestSinkToSourceAppliesEveryBatchInInstanceOrder(t *testing.T) {
	const partitions, perInstance = 3, 20
	brokers, topic := newTopic(t, partitions)
	sink := newSink(t, brokers, topic)
	instances := []string{"mp-a", "mp-b", "mp-c"}
	ctx := context.Background()
	for seq := int64(1); seq <= perInstance; seq++ {
		var list []kafkaevents.Batch
		for _, id := range instances {
			list = append(list, storeBatch(id, seq))
		}
		if err := sink.Publish(ctx, list); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	if err := sink.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	if got, want := sink.DeliveredBatches(), int64(perInstance*len(instances)); got != want || sink.DroppedBatches() != 0 {
		t.Fatalf("delivered %d dropped %d, want %d and 0", got, sink.DroppedBatches(), want)
	}

	c := newCollector()
	src := newSource(t, brokers, topic, "g-order", c)
	stop := runSource(t, src)
	recs := c.wait(t, perInstance*len(instances))
	stop()

	next := map[string]int64{}
	for _, r := range recs {
		if len(r.Batches) != 1 {
			t.Fatalf("%s: %d batches, want 1 per record", r.Position(), len(r.Batches))
		}
		b := r.Batches[0]
		if string(r.Key) != b.InstanceID {
			t.Errorf("%s: key %q, batch instance %q", r.Position(), r.Key, b.InstanceID)
		}
		if want := int32(kafkaevents.Partition(r.Key, partitions)); r.Partition != want {
			t.Errorf("%s: instance %s on partition %d, librdkafka's partitioner gives %d", r.Position(), b.InstanceID, r.Partition, want)
		}
		next[b.InstanceID]++
		if b.Seq != next[b.InstanceID] {
			t.Fatalf("%s: instance %s seq %d applied, want %d (per-instance order)", r.Position(), b.InstanceID, b.Seq, next[b.InstanceID])
		}
		if diff := cmp.Diff(storeBatch(b.InstanceID, b.Seq), b); diff != "" {
			t.Fatalf("%s: batch differs from published (-want +got):\n%s", r.Position(), diff)
		}
	}
	for _, id := range instances {
		if next[id] != perInstance {
			t.Errorf("instance %s: %d batches applied, want %d", id, next[id], perInstance)
		}
	}
	if st := src.Stats(); st.Applied != perInstance*int64(len(instances)) || st.Undecodable != 0 {
		t.Errorf("stats %+v", st)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(append(src.Collectors(), sink.Collectors()...)...)
	for name, want := range map[string]float64{
		"lmcache_coordinator_kafka_records_applied_total":      perInstance * 3,
		"lmcache_coordinator_kafka_records_undecodable_total":  0,
		"lmcache_mp_coordinator_kafka_batches_delivered_total": perInstance * 3,
		"lmcache_mp_coordinator_kafka_batches_dropped_total":   0,
	} {
		if got := gathered(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for p := int32(0); p < partitions; p++ {
		var n int64
		for _, r := range recs {
			if r.Partition == p {
				n++
			}
		}
		if got := committed(t, brokers, "g-order", topic, p); got != n {
			t.Errorf("partition %d: committed offset %d, want %d (every applied record)", p, got, n)
		}
	}
}

// A consumer that crashes after applying records but before committing them
// hands them to its successor in the group: delivery is at-least-once.
func TestSourceCrashRedeliversUncommittedRecords(t *testing.T) {
	const total = 10
	brokers, topic := newTopic(t, 1)
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 1, total)

	// The first consumer applies seq 1..5 and hangs on seq 6 until it crashes.
	var mu sync.Mutex
	var firstApplied []int64
	hung := make(chan struct{})
	first := kafkaevents.ApplierFunc(func(ctx context.Context, rec kafkaevents.Record) error {
		seq := rec.Batches[0].Seq
		if seq == 6 {
			close(hung)
			<-ctx.Done()
			return ctx.Err()
		}
		mu.Lock()
		firstApplied = append(firstApplied, seq)
		mu.Unlock()
		return nil
	})
	src1 := newSource(t, brokers, topic, "g-crash", first)
	kafkaevents.SetPollRecords(src1, total)
	stop1 := runSource(t, src1)
	select {
	case <-hung:
	case <-time.After(waitFor):
		t.Fatal("first consumer never reached seq 6")
	}
	kafkaevents.Crash(src1)
	stop1()
	mu.Lock()
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5}, firstApplied); diff != "" {
		t.Fatalf("first consumer applied (-want +got):\n%s", diff)
	}
	mu.Unlock()
	c := committed(t, brokers, "g-crash", topic, 0)
	if c >= 5 {
		t.Fatalf("committed offset %d after the crash: the applied-but-uncommitted records were committed", c)
	}
	if c < 0 {
		c = 0 // no commit: the successor starts at the earliest offset
	}

	coll := newCollector()
	src2 := newSource(t, brokers, topic, "g-crash", coll)
	stop2 := runSource(t, src2)
	recs := coll.wait(t, total-int(c))
	stop2()
	for i, r := range recs {
		if want := c + int64(i) + 1; r.Batches[0].Seq != want {
			t.Fatalf("successor record %d: seq %d, want %d (redelivery from offset %d)", i, r.Batches[0].Seq, want, c)
		}
	}
	if got := committed(t, brokers, "g-crash", topic, 0); got != total {
		t.Errorf("committed offset %d after the successor, want %d", got, total)
	}
}

// Undecodable records are counted and skipped (their offsets committed), a
// rejected record is skipped, and a transient Apply failure is retried until
// it applies.
func TestSourceSkipsUndecodableAndRetriesTransient(t *testing.T) {
	brokers, topic := newTopic(t, 1)
	good := func(seq int64) *kgo.Record {
		v, err := kafkaevents.Encode(storeBatch("mp-a", seq))
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Key: []byte("mp-a"), Value: v}
	}
	produceRaw(t, brokers, topic,
		&kgo.Record{Key: []byte("mp-a"), Value: []byte("not json")},
		good(1),
		&kgo.Record{Key: []byte("mp-a"), Value: []byte(`{"batches":[{"instance_id":"mp-a","incarnation":0,"seq":0,"event_type":"store","tier":"l2","backend":"fs"}]}`)},
		good(2),
		good(3),
	)
	var mu sync.Mutex
	calls := map[int64]int{}
	applied := make(chan int64, 16)
	app := kafkaevents.ApplierFunc(func(_ context.Context, rec kafkaevents.Record) error {
		seq := rec.Batches[0].Seq
		mu.Lock()
		calls[seq]++
		n := calls[seq]
		mu.Unlock()
		switch {
		case seq == 2 && n <= 2:
			return errors.New("gate busy")
		case seq == 3:
			return fmt.Errorf("bad stream: %w", kafkaevents.ErrRejected)
		}
		applied <- seq
		return nil
	})
	src := newSource(t, brokers, topic, "g-skip", app)
	stop := runSource(t, src)
	var got []int64
	for len(got) < 2 {
		select {
		case s := <-applied:
			got = append(got, s)
		case <-time.After(waitFor):
			t.Fatalf("applied %v before the deadline", got)
		}
	}
	// Offset 4 (seq 3, rejected) is the last record: wait for its commit.
	deadline := time.Now().Add(waitFor)
	for committed(t, brokers, "g-skip", topic, 0) != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("committed offset %d, want 5", committed(t, brokers, "g-skip", topic, 0))
		}
		time.Sleep(50 * time.Millisecond) // polling interval, not synchronisation
	}
	stop()
	if diff := cmp.Diff([]int64{1, 2}, got); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	want := kafkaevents.SourceStats{Applied: 2, Undecodable: 2, Rejected: 1, ApplyRetries: 2}
	if diff := cmp.Diff(want, src.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if calls[2] != 3 || calls[3] != 1 {
		t.Errorf("Apply calls %v, want seq 2 three times and seq 3 once", calls)
	}
	// The same counts as exported metrics (the coordinator registers
	// Collectors on its /metrics).
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(src.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gotMetrics := map[string]float64{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetCounter() != nil {
			gotMetrics[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	wantMetrics := map[string]float64{"lmcache_coordinator_kafka_apply_retries_total": 2, "lmcache_coordinator_kafka_records_applied_total": 2,
		"lmcache_coordinator_kafka_records_rejected_total": 1, "lmcache_coordinator_kafka_records_undecodable_total": 2,
		"lmcache_coordinator_kafka_consumer_errors_total": 0, "lmcache_coordinator_kafka_commit_errors_total": 0,
		"lmcache_coordinator_kafka_records_lost_total": 0}
	if diff := cmp.Diff(wantMetrics, gotMetrics); diff != "" {
		t.Errorf("exported counters (-want +got):\n%s", diff)
	}
}

func upstreamStoreBatch() kafkaevents.Batch {
	return kafkaevents.Batch{
		InstanceID: "mp-upstream-0", Incarnation: 3, Seq: 41, EventType: "store", Tier: "l2", Backend: "s3",
		Entries: []kafkaevents.Entry{
			{Key: objkey.Encoded{ChunkHashHex: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
				ModelName: "meta-llama/Llama-3.1-8B", KVRank: 16777216, CacheSalt: "tenant-a"},
				SizeBytes: 2097152, TokenIDs: []int64{128000, 791, 4062}, TokenOffset: 256},
			{Key: objkey.Encoded{ChunkHashHex: "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
				ModelName: "meta-llama/Llama-3.1-8B", KVRank: 16777216, ObjectGroupID: 1},
				SizeBytes: 1048576, TokenIDs: []int64{}, TokenOffset: -1},
		},
		Shared: true, TS: 1764620000.125,
	}
}

func upstreamConfigBatch() kafkaevents.Batch {
	return kafkaevents.Batch{InstanceID: "mp-upstream-0", Incarnation: 3, Seq: 42, EventType: "config", Tier: "l1",
		Backend: "dram", Entries: []kafkaevents.Entry{}, CapacityBytes: 64 << 30, CapacityRevision: 2}
}

// Records shaped like upstream's KafkaCacheEventSink output decode to the
// batches they describe, our encoding of those batches is byte-identical to
// them, and they pass through a Source unchanged.
func TestUpstreamRecordsDecodeIdentically(t *testing.T) {
	cases := []struct {
		file  string
		batch kafkaevents.Batch
	}{
		{"testdata/upstream_store_record.json", upstreamStoreBatch()},
		{"testdata/upstream_config_record.json", upstreamConfigBatch()},
	}
	brokers, topic := newTopic(t, 1)
	for _, tc := range cases {
		raw, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		env, err := kafkaevents.Decode(raw)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if diff := cmp.Diff(kafkaevents.Envelope{Batches: []kafkaevents.Batch{tc.batch}}, env); diff != "" {
			t.Errorf("%s decodes (-want +got):\n%s", tc.file, diff)
		}
		ours, err := kafkaevents.Encode(tc.batch)
		if err != nil {
			t.Fatal(err)
		}
		if string(ours) != string(raw) {
			t.Errorf("%s: our encoding differs:\n ours %s\n upstream %s", tc.file, ours, raw)
		}
		produceRaw(t, brokers, topic, &kgo.Record{Key: []byte(tc.batch.InstanceID), Value: raw})
	}
	c := newCollector()
	stop := runSource(t, newSource(t, brokers, topic, "g-upstream", c))
	recs := c.wait(t, len(cases))
	stop()
	for i, r := range recs {
		if diff := cmp.Diff([]kafkaevents.Batch{cases[i].batch}, r.Batches); diff != "" {
			t.Errorf("record %d through the Source (-want +got):\n%s", i, diff)
		}
		raw, _ := os.ReadFile(cases[i].file)
		if string(r.Value) != string(raw) || string(r.Key) != "mp-upstream-0" {
			t.Errorf("record %d: key %q value %s, want the produced ones", i, r.Key, r.Value)
		}
	}
}

// An entry from an emitter predating token_offset and object_group_id gets
// upstream's defaults.
func TestDecodeOlderEntryDefaults(t *testing.T) {
	env, err := kafkaevents.Decode([]byte(`{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"delete","tier":"l1","backend":"dram","entries":[{"key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":0}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := kafkaevents.Entry{Key: objkey.Encoded{ChunkHashHex: "0a", ModelName: "m"}, TokenIDs: []int64{}, TokenOffset: -1}
	if diff := cmp.Diff([]kafkaevents.Entry{want}, env.Batches[0].Entries); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if env, err := kafkaevents.Decode([]byte(`{}`)); err != nil || len(env.Batches) != 0 {
		t.Errorf("empty envelope: %v %v, want no batches and no error", env, err)
	}
}

func TestDecodeRejectsInvalidRecords(t *testing.T) {
	const ok = `"instance_id":"a","incarnation":0,"seq":1,"event_type":"store","tier":"l2","backend":"fs"`
	key := `"key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":0}`
	for name, v := range map[string]string{
		"not json":           `{"batches":[`,
		"missing seq":        `{"batches":[{"instance_id":"a","incarnation":0,"event_type":"store","tier":"l2","backend":"fs"}]}`,
		"seq 0":              `{"batches":[{"instance_id":"a","incarnation":0,"seq":0,"event_type":"store","tier":"l2","backend":"fs"}]}`,
		"empty instance":     `{"batches":[{"instance_id":"","incarnation":0,"seq":1,"event_type":"store","tier":"l2","backend":"fs"}]}`,
		"negative incarn":    `{"batches":[{"instance_id":"a","incarnation":-1,"seq":1,"event_type":"store","tier":"l2","backend":"fs"}]}`,
		"tier all":           `{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"store","tier":"all","backend":"fs"}]}`,
		"bad event type":     `{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"lookup","tier":"l2","backend":"fs"}]}`,
		"store no backend":   `{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"store","tier":"l2","backend":""}]}`,
		"config entries":     `{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"config","tier":"l2","backend":"fs","entries":[{` + key + `}]}]}`,
		"negative size":      `{"batches":[{` + ok + `,"entries":[{` + key + `,"size_bytes":-1}]}]}`,
		"token offset -2":    `{"batches":[{` + ok + `,"entries":[{` + key + `,"token_offset":-2}]}]}`,
		"bad hex":            `{"batches":[{` + ok + `,"entries":[{"key":{"chunk_hash_hex":"zz","model_name":"m","kv_rank":0}}]}]}`,
		"key without model":  `{"batches":[{` + ok + `,"entries":[{"key":{"chunk_hash_hex":"0a","kv_rank":0}}]}]}`,
		"negative ts":        `{"batches":[{` + ok + `,"ts":-1.0}]}`,
		"string seq":         `{"batches":[{"instance_id":"a","incarnation":0,"seq":"1","event_type":"store","tier":"l2","backend":"fs"}]}`,
		"negative capacity":  `{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"config","tier":"l2","backend":"fs","capacity_bytes":-1}]}`,
		"batches not a list": `{"batches":{}}`,
	} {
		if _, err := kafkaevents.Decode([]byte(v)); !errors.Is(err, kafkaevents.ErrUndecodable) {
			t.Errorf("%s: err %v, want ErrUndecodable", name, err)
		}
	}
	// access batches may omit the backend value (but not the field).
	if _, err := kafkaevents.Decode([]byte(`{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"access","tier":"l1","backend":""}]}`)); err != nil {
		t.Errorf("access with empty backend: %v", err)
	}
}

func TestPyFloatMatchesPydantic(t *testing.T) {
	for v, want := range map[float64]string{0: "0.0", 1764620000: "1764620000.0", 1764620000.125: "1764620000.125", 0.5: "0.5"} {
		got, err := kafkaevents.PyFloat(v).MarshalJSON()
		if err != nil || string(got) != want {
			t.Errorf("%v: %s %v, want %s", v, got, err, want)
		}
	}
}

func TestPublishRefusesAnInvalidListWhole(t *testing.T) {
	brokers, topic := newTopic(t, 1)
	sink := newSink(t, brokers, topic)
	bad := storeBatch("mp-a", 2)
	bad.Seq = 0
	if err := sink.Publish(context.Background(), []kafkaevents.Batch{storeBatch("mp-a", 1), bad}); err == nil {
		t.Fatal("Publish accepted a list with seq 0")
	}
	fctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := sink.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	if sink.DeliveredBatches() != 0 {
		t.Errorf("delivered %d batches from a refused list", sink.DeliveredBatches())
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(context.Background(), []kafkaevents.Batch{storeBatch("mp-a", 1)}); !errors.Is(err, kafkaevents.ErrRefused) || sink.DroppedBatches() != 1 {
		t.Errorf("Publish after Close: %v, dropped %d; want ErrRefused and 1", err, sink.DroppedBatches())
	}
}

func TestParseBrokers(t *testing.T) {
	got, err := kafkaevents.ParseBrokers(" a:9092, b:9092 ")
	if err != nil || !cmp.Equal(got, []string{"a:9092", "b:9092"}) {
		t.Errorf("got %v %v", got, err)
	}
	for _, bad := range []string{"", " ", "a:9092,,b:9092"} {
		if _, err := kafkaevents.ParseBrokers(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return 0
}

// A record queued by Publish is delivered even when the caller's context
// ends right after (a flush loop's per-tick context).
func TestPublishedRecordsOutliveTheCallersContext(t *testing.T) {
	brokers, topic := newTopic(t, 1)
	sink := newSink(t, brokers, topic)
	ctx, cancel := context.WithCancel(context.Background())
	if err := sink.Publish(ctx, []kafkaevents.Batch{storeBatch("mp-a", 1)}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if sink.DeliveredBatches() != 1 || sink.DroppedBatches() != 0 {
		t.Fatalf("delivered %d dropped %d, want 1 and 0", sink.DeliveredBatches(), sink.DroppedBatches())
	}
	c := newCollector()
	stop := runSource(t, newSource(t, brokers, topic, "g-outlive", c))
	if r := c.wait(t, 1)[0]; r.Batches[0].Seq != 1 {
		t.Errorf("got seq %d", r.Batches[0].Seq)
	}
	stop()
}

// Lag counts what the group has not committed past: everything before the
// first run, nothing once the Source has applied and committed it all; an
// unreachable broker reads as unknown, never as caught up.
func TestSourceLag(t *testing.T) {
	brokers, topic := newTopic(t, 3)
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a", "mp-b"}, 1, 4)
	c := newCollector()
	src := newSource(t, brokers, topic, "g-lag", c)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if lag, err := src.Lag(ctx); err != nil || lag != 8 {
		t.Fatalf("lag before the first run: %d %v, want 8", lag, err)
	}
	stop := runSource(t, src)
	c.wait(t, 8)
	stop()
	if lag, err := src.Lag(ctx); err != nil || lag != 0 {
		t.Fatalf("lag after applying everything: %d %v, want 0", lag, err)
	}
	publishEach(t, newSink(t, brokers, topic), []string{"mp-c"}, 1, 3)
	if lag, err := src.Lag(ctx); err != nil || lag != 3 {
		t.Fatalf("lag after 3 more: %d %v, want 3", lag, err)
	}

	dead := newSource(t, []string{"127.0.0.1:1"}, topic, "g-lag", c)
	dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer dcancel()
	if lag, err := dead.Lag(dctx); err == nil || lag != kafkaevents.UnknownLag {
		t.Fatalf("lag from an unreachable broker: %d %v, want %d and an error", lag, err, kafkaevents.UnknownLag)
	}
}

// countingListener counts the connections a kfake broker accepts.
type countingListener struct {
	net.Listener
	accepted *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// While the Source runs, Lag asks through the consumer's own client: a
// readiness loop calling it every second opens no connection per call (a
// client per call connected to the seed broker and the partition leaders
// each time). Lag still answers before Open and after Close (TestSourceLag).
//
// This test counts the broker's connections, which only the in-process
// kfake cluster can do, so it does not run against LMCACHE_TEST_KAFKA_BROKERS.
func TestSourceLagReusesTheConsumersConnections(t *testing.T) {
	const topic, calls = "lag-reuse", 5
	var accepted atomic.Int64
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			l, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return countingListener{Listener: l, accepted: &accepted}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	publishEach(t, newSink(t, brokers, topic), []string{"mp-a"}, 1, 3)
	coll := newCollector()
	src := newSource(t, brokers, topic, "g-lag-reuse", coll)
	runSource(t, src)
	coll.wait(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	// The first call may open the consumer's connection for requests
	// other than fetches and group membership.
	if lag, err := src.Lag(ctx); err != nil || lag != 0 {
		t.Fatalf("lag after applying all 3 records: %d %v, want 0", lag, err)
	}
	before := accepted.Load()
	for i := range calls {
		if lag, err := src.Lag(ctx); err != nil || lag != 0 {
			t.Fatalf("Lag call %d: %d %v, want 0", i+2, lag, err)
		}
	}
	if opened := accepted.Load() - before; opened != 0 {
		t.Errorf("%d more Lag calls opened %d connections to the broker, want 0", calls, opened)
	}
}

// Assignment tells a consumer alone in its group (all 4 partitions) from
// one that shares it: a second Source joining the same group takes some
// partitions away, the two together hold all 4, and when it leaves the
// first holds all 4 again. The topic's count is learned by Lag.
func TestSourceAssignmentShowsSharedGroup(t *testing.T) {
	brokers, topic := newTopic(t, 4)
	a := newSource(t, brokers, topic, "g-shared", newCollector())
	if got, total := a.Assignment(); got != 0 || total != -1 {
		t.Fatalf("before Run: %d of %d, want 0 of -1 (unknown)", got, total)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := a.Lag(ctx); err != nil {
		t.Fatal(err)
	}
	held := func(s *kafkaevents.Source) int { n, _ := s.Assignment(); return n }
	runSource(t, a)
	polltest.Until(t, waitFor, "the first consumer to hold all 4 partitions", func() bool { return held(a) == 4 })
	if _, total := a.Assignment(); total != 4 {
		t.Fatalf("topic partitions %d, want 4", total)
	}
	b := newSource(t, brokers, topic, "g-shared", newCollector())
	stopB := runSource(t, b)
	polltest.Until(t, waitFor, "the group to split the partitions", func() bool {
		return held(a) > 0 && held(b) > 0 && held(a)+held(b) == 4
	})
	stopB()
	if n := held(b); n != 0 {
		t.Fatalf("a stopped consumer holds %d partitions", n)
	}
	polltest.Until(t, waitFor, "the first consumer to hold all 4 again", func() bool { return held(a) == 4 })
}
