package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/coordinator/eventgate"
	"github.com/lmcache-go/lmcache/internal/coordload"
	"github.com/lmcache-go/lmcache/internal/etcdtest"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// haCoord is one `lmcache coordinator` process. Any of them may be the
// leader this test kills with SIGKILL, which proctest (a clean exit from
// every process) does not allow, so they run under exec directly: cleanup
// stops a survivor with SIGTERM and requires exit status 0.
type haCoord struct {
	name, url, log string
	cmd            *exec.Cmd
	done           chan struct{}
	err            error // read after done
	killed         bool
}

func (c *haCoord) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(c.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// stop sends SIGTERM and requires a clean exit.
func (c *haCoord) stop(t *testing.T) {
	t.Helper()
	c.killed = true
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		if c.err != nil {
			t.Errorf("%s: exit %v after SIGTERM", c.name, c.err)
		}
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
		t.Errorf("%s did not stop within 30 s of SIGTERM", c.name)
	}
}

// kill9 sends SIGKILL and waits for the exit.
func (c *haCoord) kill9(t *testing.T) {
	t.Helper()
	c.killed = true
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-c.done
}

func startHACoord(t *testing.T, name string, port int, etcd []string, extra ...string) *haCoord {
	t.Helper()
	url := "http://127.0.0.1:" + itoa(port)
	args := []string{"coordinator", "--host", "127.0.0.1", "--port", itoa(port), "--eviction-check-interval", "0.5", "--inflight-ttl", "5"}
	if etcd != nil {
		args = append(args, "--ha-etcd-endpoints", strings.Join(etcd, ","), "--ha-lease-ttl", "3", "--ha-advertise-url", url)
	}
	c := &haCoord{name: name, url: url, log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	f, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(lmcacheBin(t), append(args, extra...)...)
	c.cmd.Env = append(os.Environ(), "LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=0")
	c.cmd.Stdout, c.cmd.Stderr = f, f
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); f.Close(); close(c.done) }() // ends when the process exits
	t.Cleanup(func() {
		if !c.killed {
			c.stop(t)
		}
		if t.Failed() {
			t.Logf("--- %s log ---\n%s", name, tail([]byte(c.output(t)), 6000))
		}
	})
	waitFor(t, name+" /healthz", healthy(url+"/healthz"))
	return c
}

func (c *haCoord) ready() (bool, float64) {
	resp, err := client.Get(c.url + "/readyz")
	if err != nil {
		return false, 0
	}
	defer resp.Body.Close()
	var r struct {
		FenceRevision float64 `json:"fence_revision"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode == 200, r.FenceRevision
}

// ledgerView is what a coordinator's ledger holds: bytes per salt (from
// GET /quota, exact: a GiB float of an integer byte count round-trips) and
// the tracked key and byte totals (from /metrics).
type ledgerView struct {
	Salts map[string]int64
	Keys  int64
	Bytes int64
}

func (c *haCoord) ledger(t *testing.T) (ledgerView, bool) {
	t.Helper()
	var usage struct {
		ByCacheSalt []struct {
			CacheSalt string  `json:"cache_salt"`
			UsageGB   float64 `json:"usage_gb"`
		} `json:"by_cache_salt"`
	}
	resp, err := client.Get(c.url + "/quota")
	if err != nil {
		return ledgerView{}, false
	}
	err = json.NewDecoder(resp.Body).Decode(&usage)
	resp.Body.Close()
	if err != nil {
		return ledgerView{}, false
	}
	v := ledgerView{Salts: map[string]int64{}}
	for _, r := range usage.ByCacheSalt {
		if b := int64(math.Round(r.UsageGB * (1 << 30))); b > 0 {
			v.Salts[r.CacheSalt] = b
		}
	}
	v.Keys = int64(scrape(c.url, "lmcache_coordinator_tracked_keys"))
	v.Bytes = int64(scrape(c.url, "lmcache_coordinator_tracked_bytes"))
	return v, true
}

func (v ledgerView) equal(o ledgerView) bool {
	return v.Keys == o.Keys && v.Bytes == o.Bytes && maps.Equal(v.Salts, o.Salts)
}

// scrape reads one unlabelled sample (NaN when absent or unreachable).
func scrape(url, name string) float64 {
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		return math.NaN()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err == nil {
				return v
			}
		}
	}
	return math.NaN()
}

// TestHAFailoverKill9 is the failover proof over Kafka (a kfake cluster in
// the test process, or $LMCACHE_TEST_KAFKA_BROKERS): the simulated servers
// publish their events as `lmcache server --coordinator-event-transport
// kafka` does and every coordinator consumes the topic in its own group.
// After the failover checks, all coordinators restart at once and are warm
// from their checkpoints plus replay.
func TestHAFailoverKill9(t *testing.T) { haFailover(t, true) }

// TestHAFailoverKill9HTTP is the same proof with the servers posting every
// batch to every coordinator's POST /events.
func TestHAFailoverKill9HTTP(t *testing.T) { haFailover(t, false) }

// haFailover: three `lmcache coordinator` processes on a real
// three-member etcd cluster, plus a reference coordinator outside the
// election that evicts nothing, and 20 simulated MP servers
// (coordload.Fleet) streaming store events that all four ingest. Quotas
// put through a standby are redirected to the leader and land in etcd. The
// leader is killed with SIGKILL mid-ingest: a standby takes over with a
// higher fencing token and the intent, eviction resumes under it, and
// once the stream drains its ledger, the other standby's and the
// reference's equal what the fleet holds (same keys, sizes and bytes per
// salt). Killing one etcd member changes nothing: same leader, same token,
// intent writes still commit.
func haFailover(t *testing.T, kafka bool) {
	cl := etcdtest.Start(t, 3)
	dir := t.TempDir()
	var brokers, topic string
	var sink *kafkaevents.Sink
	if kafka {
		brokers, topic = startKafka(t, 8)
		var err error
		sink, err = kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: strings.Split(brokers, ","), Topic: topic, DeliveryTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sink.Close() })
	}
	// Every coordinator checkpoints each second (over HTTP too: the
	// checkpoint is how this test reads a ledger key by key).
	ckptOf := func(c *haCoord) string { return filepath.Join(dir, c.name+".ckpt") }
	ingest := func(name string) []string {
		ck := []string{"--checkpoint-path", filepath.Join(dir, name+".ckpt"), "--checkpoint-interval", "1"}
		if !kafka {
			return ck
		}
		return append([]string{"--event-transport", "kafka", "--kafka-bootstrap-servers", brokers, "--kafka-topic", topic, "--kafka-group-id", name}, ck...)
	}
	ports := map[string]int{}
	launch := func(name string, etcd []string, extra ...string) *haCoord {
		if ports[name] == 0 {
			ports[name] = freePort(t)
		}
		return startHACoord(t, name, ports[name], etcd, append(ingest(name), extra...)...)
	}
	var coords []*haCoord
	for i := range 3 {
		coords = append(coords, launch(fmt.Sprintf("coord-%d", i), cl.Endpoints))
	}
	ref := launch("coord-ref", nil, "--eviction-check-interval", "0")
	leaderOf := func(cs []*haCoord) (*haCoord, float64) {
		for _, c := range cs {
			if ok, rev := c.ready(); ok {
				return c, rev
			}
		}
		return nil, 0
	}
	var lead *haCoord
	var revA float64
	waitFor(t, "a leader", func() bool { lead, revA = leaderOf(coords); return lead != nil })
	var standbys []*haCoord
	for _, c := range coords {
		if c != lead {
			standbys = append(standbys, c)
		}
	}

	// Quotas put through a standby: 307 to the leader, followed by the
	// client (PUT with its body), committed to etcd.
	const salts, perInstance, instances = 4, 1500, 20
	const size = 1 << 20
	limit := 3.0 // GiB: tenant-0 and tenant-1 hold about 7.3 GiB each
	for _, salt := range []string{"tenant-0", "tenant-1"} {
		var out map[string]any
		if code, _ := call(t, "PUT", standbys[0].url+"/quota/"+salt, map[string]any{"limit_gb": limit}, nil, &out); code != 200 || out["status"] != "ok" {
			t.Fatalf("PUT quota via standby: %d %v", code, out)
		}
		if code, _ := call(t, "PUT", ref.url+"/quota/"+salt, map[string]any{"limit_gb": limit}, nil, nil); code != 200 {
			t.Fatalf("PUT quota on the reference: %d", code)
		}
	}

	targets := []string{ref.url}
	for _, c := range coords {
		targets = append(targets, c.url)
	}
	fleet, err := coordload.StartFleet(context.Background(), coordload.FleetConfig{Targets: targets, Instances: instances,
		KeysPerInstance: perInstance, Batch: 25, Salts: salts, Bytes: size, Window: 2, Pace: 100 * time.Millisecond, Heartbeat: 500 * time.Millisecond,
		Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.Close(); err != nil {
			t.Errorf("fleet: %v", err)
		}
	})

	// Mid-ingest, after the leader has started evicting: SIGKILL.
	waitFor(t, "the leader to evict mid-ingest", func() bool {
		n, done := fleet.Produced()
		return !done && n > instances*perInstance/3 && n < instances*perInstance*3/4 && scrape(lead.url, "lmcache_coordinator_eviction_keys_dispatched_total") > 0
	})
	stored, _ := fleet.Produced()
	killed := time.Now()
	lead.kill9(t)
	fleet.Drop(lead.url)
	var next *haCoord
	var revB float64
	deadline := time.Now().Add(60 * time.Second)
	for next == nil {
		if time.Now().After(deadline) {
			t.Fatal("no standby took over")
		}
		next, revB = leaderOf(standbys)
		if next == nil {
			time.Sleep(20 * time.Millisecond) // polling interval (sets the measurement's resolution)
		}
	}
	failover := time.Since(killed)
	t.Logf("failover: %v from SIGKILL of %s to %s ready (lease TTL 3 s); %d of %d keys stored at the kill",
		failover.Round(time.Millisecond), lead.name, next.name, stored, instances*perInstance)
	if revB <= revA {
		t.Fatalf("new leader's fencing token %v not above the old %v", revB, revA)
	}
	var q map[string]any
	call(t, "GET", next.url+"/quota/tenant-0", nil, nil, &q)
	if q["quota_exists"] != true || q["quota_limit_gb"] != limit {
		t.Fatalf("new leader's quota for tenant-0: %v", q)
	}

	// Eviction resumes under the new term.
	waitFor(t, "the new leader to evict", func() bool {
		return scrape(next.url, "lmcache_coordinator_eviction_keys_dispatched_total") > 0 &&
			scrape(next.url, "lmcache_coordinator_eviction_dispatch_fence_revision") == revB
	})
	if !strings.Contains(next.output(t), "fence_revision="+strconv.Itoa(int(revB))) {
		t.Errorf("%s's dispatch log lacks fence_revision=%d", next.name, int(revB))
	}

	// The stream drains; every ledger converges on what the fleet holds.
	var other *haCoord
	for _, c := range standbys {
		if c != next {
			other = c
		}
	}
	var truth, got, gotRef, gotOther ledgerView
	waitFor(t, "ledgers equal to the fleet's", func() bool {
		_, done := fleet.Produced()
		if !done || !fleet.Caught(next.url) || !fleet.Caught(ref.url) || !fleet.Caught(other.url) {
			return false
		}
		saltBytes, keys := fleet.Live()
		truth = ledgerView{Salts: saltBytes, Keys: int64(keys)}
		for _, b := range saltBytes {
			truth.Bytes += b
		}
		var ok1, ok2, ok3 bool
		got, ok1 = next.ledger(t)
		gotRef, ok2 = ref.ledger(t)
		gotOther, ok3 = other.ledger(t)
		return ok1 && ok2 && ok3 && got.equal(truth) && gotRef.equal(truth) && gotOther.equal(truth)
	})
	evicted := instances*perInstance - int(truth.Keys)
	var whole2 int64 // tenant-2 has no quota: all of it stays
	for g := 2; g < instances*perInstance; g += salts {
		whole2 += size + int64(g)
	}
	if evicted == 0 || truth.Salts["tenant-2"] != whole2 || truth.Salts["tenant-0"] >= whole2 {
		t.Fatalf("eviction did not take the quota'd salts only: %d evicted, %+v (tenant-2 whole: %d)", evicted, truth.Salts, whole2)
	}
	t.Logf("drained: %d keys (%d evicted) on the new leader, the other standby and the reference, equal to the fleet's", truth.Keys, evicted)

	// Key by key: each ledger's checkpoint holds exactly the fleet's keys
	// with their sizes, and its event-gate cursors say every batch of every
	// instance was applied once: none lost (no seq gap, last seq the
	// instance's last), none twice (no duplicate over Kafka, whose producer
	// is idempotent and whose consumers never restarted; over HTTP at most
	// the fleet's retries to that coordinator, each dropped unapplied).
	exactLedgers(t, fleet, kafka, []*haCoord{next, other, ref}, ckptOf)

	// One etcd member dies (a follower): same leader, same token, no
	// second term, intent still commits and is mirrored. The loss of the
	// raft leader is leader.TestLeadershipSurvivesEtcdLeaderLoss: here, at
	// this test's short lease (TTL 3 s, renew deadline 2 s), etcd's own
	// election on a loaded machine can outlast the renew deadline, and the
	// coordinator then rightly steps down and is re-elected, which is the
	// fencing working, not "nothing changes".
	admin := etcdtest.NewClient(t, cl.Endpoints)
	elections := scrape(next.url, "lmcache_coordinator_leader_elections_total")
	victim := cl.Follower(t, admin)
	victim.Kill(t)
	t.Logf("killed etcd member %s (a follower)", victim.Name)
	// A write the leader had sent to the killed member before its client
	// noticed the death has an unknown outcome: the coordinator answers
	// 503 and the operator retries (the PUT is idempotent). The retry must
	// commit while two of three members live.
	waitFor(t, "PUT quota with one etcd member down", func() bool {
		code, _ := call(t, "PUT", next.url+"/quota/tenant-3", map[string]any{"limit_gb": 100}, nil, nil)
		if code != 200 && code != 503 {
			t.Fatalf("PUT quota with one etcd member down: %d, want 200 (or 503 for a write lost with the member)", code)
		}
		return code == 200
	})
	waitFor(t, "the standby mirrors the new quota", func() bool {
		var q map[string]any
		call(t, "GET", other.url+"/quota/tenant-3", nil, nil, &q)
		return q["quota_exists"] == true
	})
	if ok, rev := next.ready(); !ok || rev != revB {
		t.Fatalf("leader after etcd member loss: ready %v revision %v, want %v", ok, rev, revB)
	}
	if ok, _ := other.ready(); ok {
		t.Fatal("two leaders after etcd member loss")
	}
	if lost := scrape(next.url, "lmcache_coordinator_leader_lost_total"); lost != 0 {
		t.Fatalf("leader lost_total %v", lost)
	}
	if e := scrape(next.url, "lmcache_coordinator_leader_elections_total"); e != elections || !(e >= 1) {
		t.Fatalf("leader elections_total %v after the etcd member's death, %v before: a second term", e, elections)
	}
	if e := scrape(other.url, "lmcache_coordinator_leader_elections_total"); e != 0 {
		t.Fatalf("the standby won %v elections", e)
	}
	if got := scrape(other.url, "lmcache_coordinator_eviction_keys_dispatched_total"); got != 0 {
		t.Fatalf("the standby dispatched %v keys", got)
	}
	var hr map[string]any
	if code, _ := call(t, "GET", other.url+"/healthz", nil, nil, &hr); code != http.StatusOK {
		t.Fatalf("standby /healthz %d", code)
	}
	if !kafka {
		return
	}
	if err := fleet.PublishErr(); err != nil || sink.DroppedBatches() != 0 {
		t.Fatalf("publishing: %v, %d batches dropped", err, sink.DroppedBatches())
	}
	for _, c := range []*haCoord{next, other, ref} {
		for _, m := range []string{"lmcache_coordinator_kafka_records_rejected_total", "lmcache_coordinator_kafka_records_undecodable_total"} {
			if v := scrape(c.url, m); v != 0 {
				t.Errorf("%s %s = %v", c.name, m, v)
			}
		}
	}

	// Restart every coordinator at once (the one killed earlier too): each
	// is warm from its checkpoint plus the replay of the topic past it.
	for _, c := range []*haCoord{next, other, ref} {
		c.stop(t)
	}
	began := time.Now()
	var again []*haCoord
	for _, c := range coords {
		again = append(again, launch(c.name, cl.Endpoints))
	}
	refAgain := launch(ref.name, nil, "--eviction-check-interval", "0")
	warmAt := map[string]time.Duration{} // first moment each ledger equalled the fleet's
	waitFor(t, "every restarted ledger equal to the fleet's, and a leader", func() bool {
		saltBytes, keys := fleet.Live()
		want := ledgerView{Salts: saltBytes, Keys: int64(keys)}
		for _, b := range saltBytes {
			want.Bytes += b
		}
		all := true
		for _, c := range append([]*haCoord{refAgain}, again...) {
			if _, done := warmAt[c.name]; done {
				continue
			}
			if v, ok := c.ledger(t); ok && v.equal(want) {
				warmAt[c.name] = time.Since(began)
			} else {
				all = false
			}
		}
		l, _ := leaderOf(again)
		return all && l != nil
	})
	warm := time.Since(began)
	// The restarted ledgers, key by key, once each has checkpointed again.
	exactLedgers(t, fleet, kafka, append([]*haCoord{refAgain}, again...), ckptOf)
	t.Logf("per coordinator, restart to ledger equal (%s was killed: its old group member must time out first): %v", lead.name, warmAt)
	for _, c := range append([]*haCoord{refAgain}, again...) {
		if n := scrape(c.url, "lmcache_coordinator_checkpoint_restored_keys"); !(n > 0) {
			t.Errorf("%s restored %v keys from its checkpoint", c.name, n)
		}
	}
	t.Logf("restart of all four coordinators: %v until every ledger equals the fleet's (%d keys then; checkpoint + replay)", warm.Round(time.Millisecond), len(fleet.LiveKeys()))
}

// checkpointLedger decodes a checkpoint's ledger section (the layout
// ledger.AppendCheckpoint writes: models, then per salt its keys in LRU
// order with their sizes) into key -> size, LRU order left out: consumers
// of different partitions interleave instances differently, so only keys
// and sizes are the same in every ledger. It also returns the gate section
// restored into a gate.
func checkpointLedger(path string) (map[objkey.Encoded]int64, *eventgate.Gate, error) {
	d, err := checkpoint.Load(path)
	if err != nil {
		return nil, nil, err
	}
	keys := map[objkey.Encoded]int64{}
	g := eventgate.New(0)
	err = d.Sections(map[string]func(*checkpoint.Decoder){
		"ledger": func(d *checkpoint.Decoder) {
			models := make([]string, d.Count(1))
			for i := range models {
				models[i] = d.String()
			}
			for range d.Count(1) {
				salt := d.String()
				for range d.Count(4) {
					m, rank, hl := d.Uvarint(), d.Varint(), d.Uvarint()
					if hl > 32 || m >= uint64(len(models)) {
						d.Failf("entry with a %d-byte hash or model %d of %d (long keys are not in this fleet)", hl, m, len(models))
						return
					}
					k := objkey.Encoded{ChunkHashHex: hex.EncodeToString(d.Raw(int(hl))), ModelName: models[m], KVRank: rank, CacheSalt: salt}
					k.ObjectGroupID = int64(d.Uvarint())
					if _, dup := keys[k]; dup {
						d.Failf("key %v twice", k)
						return
					}
					keys[k] = d.Varint()
					if d.Err() != nil {
						return
					}
				}
			}
		},
		"gate": func(d *checkpoint.Decoder) { g.Restore(d) },
	})
	return keys, g, err
}

// exactLedgers waits until every coordinator's checkpoint holds exactly
// the fleet's keys and sizes, and its gate cursor for every instance
// reads the instance's last seq with each batch applied once: no gap, no
// stale batch, no fence, duplicates 0 over Kafka (at most the fleet's
// retries to it over HTTP). The fleet's seqs are read before and after its
// key set, so one poll's reading is of one moment.
func exactLedgers(t *testing.T, fleet *coordload.Fleet, kafka bool, cs []*haCoord, ckptOf func(*haCoord) string) {
	t.Helper()
	var why string
	deadline := time.Now().Add(60 * time.Second)
	for {
		why = ""
		seqs, want := fleet.Seqs(), fleet.LiveKeys()
		if !maps.Equal(seqs, fleet.Seqs()) {
			why = "the fleet moved"
		}
		for _, c := range cs {
			if why != "" {
				break
			}
			keys, g, err := checkpointLedger(ckptOf(c))
			switch {
			case err != nil:
				why = fmt.Sprintf("%s: %v", c.name, err)
			case !maps.Equal(keys, want):
				why = fmt.Sprintf("%s: %s", c.name, keyDiff(keys, want))
			}
			for id, seq := range seqs {
				if why != "" {
					break
				}
				st, _ := g.Stats(id)
				dups := int64(0)
				if !kafka {
					dups = fleet.Retries(c.url)
				}
				if st == nil || st.LastSeq != seq || st.Applied != seq || st.Gaps != 0 || st.Stale != 0 || st.Fences != 0 || st.Duplicates > dups || (kafka && st.Duplicates != 0) {
					why = fmt.Sprintf("%s: gate cursor of %s %+v, want last seq = applied = %d, no gap, stale or fence, duplicates <= %d", c.name, id, st, seq, dups)
				}
			}
		}
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpointed ledgers never equalled the fleet's key by key: %s", why)
		}
		time.Sleep(100 * time.Millisecond) // polling interval (checkpoints are written each second)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.name)
	}
	t.Logf("%v: checkpointed ledgers equal the fleet's %d keys and sizes exactly; every instance's batches applied once", names, len(fleet.LiveKeys()))
}

// keyDiff describes how got differs from want (counts and one example).
func keyDiff(got, want map[objkey.Encoded]int64) string {
	var missing, extra, resized int
	var ex string
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing++
			if ex == "" {
				ex = fmt.Sprintf("missing %v", k)
			}
		case g != v:
			resized++
			if ex == "" {
				ex = fmt.Sprintf("%v size %d, want %d", k, g, v)
			}
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra++
			if ex == "" {
				ex = fmt.Sprintf("extra %v", k)
			}
		}
	}
	return fmt.Sprintf("%d keys, want %d: %d missing, %d extra, %d of another size (%s)", len(got), len(want), missing, extra, resized, ex)
}
