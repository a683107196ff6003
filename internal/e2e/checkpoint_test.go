package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/coordinator/eventgate"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// killable is a process this file kills with SIGKILL (proctest requires a
// clean exit of every process it started).
type killable struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startKillable(t *testing.T, name string, env []string, args ...string) *killable {
	t.Helper()
	log := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(lmcacheBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k := &killable{cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(k.done) }()
	t.Cleanup(func() {
		k.kill()
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("--- %s log ---\n%s", name, tail(b, 6000))
		}
	})
	return k
}

// kill sends SIGKILL (kill -9) and waits for the exit.
func (k *killable) kill() {
	_ = k.cmd.Process.Kill()
	<-k.done
}

// checkpointEvents is a deterministic event stream: instance i writes salt
// "ck<i>" only (so every salt's LRU order is the instance's own order, the
// same in every consumer), with stores of new keys, deletes, and re-stores
// that change a size and move a key to the MRU end.
type checkpointEvents struct {
	instances int
	// usage is what a coordinator that saw every batch once holds, by salt.
	usage map[string]int64
	live  map[string]map[string]int64 // salt -> hash -> size
}

func newCheckpointEvents(instances int) *checkpointEvents {
	return &checkpointEvents{instances: instances, usage: map[string]int64{}, live: map[string]map[string]int64{}}
}

func ckHash(i, n int) string { return fmt.Sprintf("%056x%04x%04x", 7, i, n) }

// batches returns seq from..to of every instance, interleaved.
func (g *checkpointEvents) batches(from, to int) []kafkaevents.Batch {
	var out []kafkaevents.Batch
	for n := from; n <= to; n++ {
		for i := 0; i < g.instances; i++ {
			s := fmt.Sprintf("ck%d", i)
			if g.live[s] == nil {
				g.live[s] = map[string]int64{}
			}
			typ, h, size := kafkaevents.EventStore, ckHash(i, n), int64(1000+n)
			switch {
			case n%5 == 0 && n > 3:
				typ, h = kafkaevents.EventDelete, ckHash(i, n-3)
				size = g.live[s][h]
			case n%7 == 0 && n > 2:
				h, size = ckHash(i, n-2), int64(n)
			}
			if typ == kafkaevents.EventDelete {
				g.usage[s] -= g.live[s][h]
				delete(g.live[s], h)
			} else {
				g.usage[s] += size - g.live[s][h]
				g.live[s][h] = size
			}
			out = append(out, kafkaevents.Batch{
				InstanceID: fmt.Sprintf("ck-mp-%d", i), Incarnation: 1, Seq: int64(n), EventType: typ, Tier: kafkaevents.TierL2,
				Backend: "fs", TS: kafkaevents.PyFloat(1767225600 + float64(n)),
				Entries: []kafkaevents.Entry{{Key: objkey.Encoded{ChunkHashHex: h, ModelName: model, KVRank: 0, CacheSalt: s},
					SizeBytes: size, TokenIDs: []int64{}, TokenOffset: kafkaevents.UnknownTokenOffset}},
			})
		}
	}
	return out
}

func publish(t *testing.T, sink *kafkaevents.Sink, batches []kafkaevents.Batch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, b := range batches {
		if err := sink.Publish(ctx, []kafkaevents.Batch{b}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// caughtUp reports whether coordURL holds the generator's usage for every
// salt and has no Kafka lag left.
func (g *checkpointEvents) caughtUp(t *testing.T, coordURL string) func() bool {
	return func() bool {
		for s, want := range g.usage {
			if saltUsage(t, coordURL, s) != want {
				return false
			}
		}
		return metricValue(metricsText(t, coordURL), "lmcache_coordinator_kafka_lag") == "0"
	}
}

// checkpointSections reads a checkpoint's ledger section (raw bytes) and
// gate (restored into a gate).
func checkpointSections(t *testing.T, path string) ([]byte, *eventgate.Gate) {
	t.Helper()
	d, err := checkpoint.Load(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	var led []byte
	g := eventgate.New(0)
	if err := d.Sections(map[string]func(*checkpoint.Decoder){
		"ledger": func(d *checkpoint.Decoder) { led = bytes.Clone(d.Rest()) },
		"gate":   func(d *checkpoint.Decoder) { g.Restore(d) },
	}); err != nil {
		t.Fatalf("sections of %s: %v", path, err)
	}
	return led, g
}

// TestKafkaCheckpointKillReplayEqualsReference: a kafka-mode coordinator
// with --checkpoint-path checkpoints at a clean stop, restarts warm from it
// (its restored key count is the checkpoint's), applies more of the stream
// and is killed with SIGKILL before its next checkpoint (its group's commit
// is now past the checkpoint). More events arrive while it is down. The
// restart loads the old checkpoint and replays the stream from the
// checkpoint's position (not the group's commit), so after the stream
// drains its ledger (keys, sizes, per-salt LRU order: the checkpoint's
// ledger sections are byte-identical) and gate cursors equal those of a
// reference coordinator that read every event once in its own group; a
// batch the producer sent twice is applied once by both.
func TestKafkaCheckpointKillReplayEqualsReference(t *testing.T) {
	brokers, topic := startKafka(t, 3)
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: splitBrokers(brokers), Topic: topic, DeliveryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	gen := newCheckpointEvents(4)
	dir := t.TempDir()
	refPath, ckPath := filepath.Join(dir, "ref.ckpt"), filepath.Join(dir, "a.ckpt")
	env := []string{"LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=false"}

	refPort := freePort(t)
	ref := start(t, "reference", env, kafkaCoordinatorArgs(refPort, brokers, topic, "ck-ref", "--eviction-check-interval", "0",
		"--checkpoint-path", refPath, "--checkpoint-interval", "0")...)
	refURL := "http://127.0.0.1:" + itoa(refPort)
	waitFor(t, "reference healthz", healthy(refURL+"/healthz"))

	aPort := freePort(t)
	aURL := "http://127.0.0.1:" + itoa(aPort)
	aArgs := kafkaCoordinatorArgs(aPort, brokers, topic, "ck-a", "--eviction-check-interval", "0",
		"--checkpoint-path", ckPath, "--checkpoint-interval", "3600")
	a1 := start(t, "coordinator-1", env, aArgs...)
	waitFor(t, "coordinator-1 healthz", healthy(aURL+"/healthz"))

	publish(t, sink, gen.batches(1, 40))
	waitFor(t, "coordinator-1 applied seq 1..40", gen.caughtUp(t, aURL))
	a1.Stop(t) // clean stop: the checkpoint
	keys1 := 0
	for _, m := range gen.live {
		keys1 += len(m)
	}

	a2 := startKillable(t, "coordinator-2", env, aArgs...)
	waitFor(t, "coordinator-2 healthz", healthy(aURL+"/healthz"))
	if v := metricValue(metricsText(t, aURL), "lmcache_coordinator_checkpoint_restored_keys"); v != strconv.Itoa(keys1) {
		t.Fatalf("coordinator-2 restored %s keys, want %d (warm from the checkpoint)", v, keys1)
	}
	second := gen.batches(41, 80)
	// At-least-once delivery: the producer sends one batch twice.
	second = append(second, second[len(second)/2])
	publish(t, sink, second)
	waitFor(t, "coordinator-2 applied seq 41..80", gen.caughtUp(t, aURL))
	a2.kill() // kill -9, no checkpoint since the restore

	publish(t, sink, gen.batches(81, 100))
	restarted := time.Now()
	a3 := start(t, "coordinator-3", env, aArgs...)
	waitFor(t, "coordinator-3 healthz", healthy(aURL+"/healthz"))
	if v := metricValue(metricsText(t, aURL), "lmcache_coordinator_checkpoint_restored_keys"); v != strconv.Itoa(keys1) {
		t.Fatalf("coordinator-3 restored %s keys, want %d (the clean stop's checkpoint)", v, keys1)
	}
	waitFor(t, "coordinator-3 replayed to the end", gen.caughtUp(t, aURL))
	// Informational (no timing assertion): the dead member's group session
	// (10 s) must expire before the partitions come back to the group.
	t.Logf("restart after kill -9: checkpoint loaded and stream replayed in %v", time.Since(restarted))
	waitFor(t, "reference read every event", gen.caughtUp(t, refURL))
	a3.Stop(t)
	ref.Stop(t)

	gotLedger, gotGate := checkpointSections(t, ckPath)
	wantLedger, wantGate := checkpointSections(t, refPath)
	if len(wantLedger) == 0 || !bytes.Equal(gotLedger, wantLedger) {
		t.Errorf("restarted coordinator's ledger section (%d bytes) differs from the reference's (%d bytes)", len(gotLedger), len(wantLedger))
	}
	var gotDups, wantDups int64
	for i := 0; i < gen.instances; i++ {
		id := fmt.Sprintf("ck-mp-%d", i)
		got, _ := gotGate.Stats(id)
		want, _ := wantGate.Stats(id)
		if got == nil || want == nil || got.Incarnation != want.Incarnation || got.LastSeq != 100 || want.LastSeq != 100 {
			t.Fatalf("%s cursor: restarted %+v, reference %+v, want last seq 100", id, got, want)
		}
		gotDups += got.Duplicates
		wantDups += want.Duplicates
	}
	// The batch sent twice was dropped once by each (the restarted one
	// saw it during its replay, after the checkpoint).
	if gotDups != 1 || wantDups != 1 {
		t.Errorf("duplicates dropped: restarted %d, reference %d, want 1 each", gotDups, wantDups)
	}
}

func splitBrokers(s string) []string {
	var out []string
	for _, b := range bytes.Split([]byte(s), []byte(",")) {
		if len(b) > 0 {
			out = append(out, string(b))
		}
	}
	return out
}
