package e2e

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvevents"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// The worker layout of these tests: 2 layers x 64 hidden x fp16 with
// chunkSize-token chunks, 8 KiB objects.
func kvRegistration(inst int64) *wire.RegisterPayload {
	return &wire.RegisterPayload{InstanceID: wire.Int(inst), ModelName: "m", WorldSize: 1, BlockSize: chunkSize,
		NumLayers: 2, HiddenDimSize: 64, DtypeStr: "float16",
		NumPhysicalSlots: wire.Nil, EngineGroupInfos: wire.EmptyList, GroupHiddenDimSizes: wire.Nil, GroupLayoutDescs: wire.Nil}
}

// kvWorker is a vLLM worker on the ZMQ data path of a real server.
type kvWorker struct {
	t      *testing.T
	c      *mqclient.Client
	hasher *tokenhash.Hasher
}

func dialWorker(t *testing.T, zmqPort int, shm string) *kvWorker {
	t.Helper()
	c, err := mqclient.Dial("tcp://127.0.0.1:"+itoa(zmqPort), mqclient.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.GetChunkSize(); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Register(kvRegistration(1))
	if err != nil || resp.ShmName != "lmcache_l1_pool_"+shm {
		t.Fatalf("register: %+v %v", resp, err)
	}
	h, err := tokenhash.New(tokenhash.Blake3, chunkSize)
	if err != nil {
		t.Fatal(err)
	}
	return &kvWorker{t: t, c: c, hasher: h}
}

// store writes prompt seed (chunks chunks) through PREPARE_STORE and
// COMMIT_STORE (the slots' content does not matter here) and returns the
// external (vLLM) hashes of the chunks the server took, with their
// parents.
func (w *kvWorker) store(seed, chunks int) (hashes, parents []uint64) {
	w.t.Helper()
	toks := make([]uint32, chunks*chunkSize)
	ids := make([]wire.Int, len(toks))
	for i := range toks {
		toks[i] = uint32((seed*1_000_003 + i*7919) % 150000)
		ids[i] = wire.Int(toks[i])
	}
	key := &wire.Key{ModelName: "m", WorldSize: 1, WorkerID: wire.SomeInt(0), TokenIDs: ids, End: wire.Int(len(ids)),
		RequestID: fmt.Sprintf("req-%d", seed), NumKVReaders: 1}
	plan, err := w.c.PrepareStore(key, 1)
	if err != nil {
		w.t.Fatal(err)
	}
	if ok, err := w.c.CommitStore(key, 1, nil); err != nil || (len(plan.Slots) > 0 && !ok) {
		w.t.Fatalf("COMMIT_STORE = %v, %v", ok, err)
	}
	all := w.hasher.ChunkHashesU32(toks)
	for _, i := range plan.ChunkIndices {
		hashes = append(hashes, kvevents.ExternalHash(all[i]))
		if i == 0 {
			parents = append(parents, 0)
		} else {
			parents = append(parents, kvevents.ExternalHash(all[i-1]))
		}
	}
	return hashes, parents
}

// pollPage is one decoded POLL_KV_EVENTS reply.
type pollPage struct {
	Enabled     bool
	Incarnation int64
	Next        int64
	Lost        bool
	Records     []map[string]any
}

func (w *kvWorker) poll(cursor, max int64) pollPage {
	w.t.Helper()
	resp, err := w.c.Call(wire.OpPollKVEvents, msgp.AppendString(nil, "m"), msgp.AppendInt64(nil, cursor), msgp.AppendInt64(nil, max))
	if err != nil {
		w.t.Fatal(err)
	}
	v, _, err := msgp.ReadIntfBytes(resp)
	if err != nil {
		w.t.Fatal(err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		w.t.Fatalf("POLL_KV_EVENTS reply %v", v)
	}
	p := pollPage{Enabled: m["enabled"].(bool), Incarnation: m["incarnation"].(int64), Next: m["next_cursor"].(int64), Lost: m["lost"].(bool)}
	for _, r := range m["events"].([]any) {
		p.Records = append(p.Records, r.(map[string]any))
	}
	return p
}

// pollAll pages through the log from cursor to its end.
func (w *kvWorker) pollAll(cursor int64) ([]map[string]any, int64, bool) {
	w.t.Helper()
	var all []map[string]any
	lost := false
	for {
		p := w.poll(cursor, 4096)
		lost = lost || p.Lost
		all = append(all, p.Records...)
		if p.Next == cursor {
			return all, cursor, lost
		}
		cursor = p.Next
	}
}

// num is n as the subscriber's JSON (decoded with UseNumber) shows it.
func num[T int | uint64](n T) json.Number { return json.Number(fmt.Sprint(n)) }

// vllmEvent is one record as a vLLM router sees it: [type, hashes, parent,
// tokens, medium] (the subscriber's form, without the batch sequence).
func vllmEvent(r map[string]any) []any {
	var hs []any
	for _, h := range r["block_hashes"].([]any) {
		hs = append(hs, num(kvevents.ExternalHash(h.([]byte))))
	}
	if r["kind"] == kvevents.KindRemoved {
		return []any{"BlockRemoved", hs, nil, num(0), r["medium"]}
	}
	var parent any
	if p, ok := r["parent_block_hash"].([]byte); ok {
		parent = num(kvevents.ExternalHash(p))
	}
	return []any{"BlockStored", hs, parent, num(len(r["token_ids"].([]any))), r["medium"]}
}

// startServerKV starts a server with the fs L2 adapter and the given extra
// flags and waits for its health check.
func startServerKV(t *testing.T, name string, httpPort, zmqPort int, shm string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"server", "--http-port", itoa(httpPort), "--port", itoa(zmqPort), "--chunk-size", itoa(chunkSize),
		"--l1-size-gb", "0.03125", "--shm-name", shm,
		"--l2-adapter", `{"type":"fs","base_path":"` + t.TempDir() + `"}`}, extra...)
	p := start(t, name, nil, args...)
	waitFor(t, name+" healthcheck", healthy("http://127.0.0.1:"+itoa(httpPort)+"/healthcheck"))
	return p
}

func shmName(t *testing.T, tag string) string {
	name := fmt.Sprintf("kvev_%s_%d", tag, os.Getpid())
	t.Cleanup(func() { _ = os.Remove("/dev/shm/lmcache_l1_pool_" + name) })
	return name
}

// TestKVEventsPythonSubscriber is the router's view end to end: a Python
// SUB (Debian's python3-zmq and python3-msgpack, scripts/interop/
// kv_events_sub.py) subscribes to a real server's native publisher while a
// worker stores 5,376 chunks through the ZMQ data path into a 32 MiB L1
// (so L1 evicts) with an fs L2 behind it; then 100 chunks are deleted from
// L2 (DELETE /cache/objects) and L1 is cleared (POST /cache/clear). Every
// stored chunk arrives as BlockStored (medium CPU, and STORAGE once
// uploaded) with its tokens and parent, every removed one as BlockRemoved
// (evictions and the clear as CPU, the deletes as STORAGE; never
// AllBlocksCleared), in sequence order; the subscriber discards live
// sequences 50-149 and recovers them through the replay socket; of more
// than 10,000 events none is lost: its list equals the POLL_KV_EVENTS log
// of the same server record for record.
func TestKVEventsPythonSubscriber(t *testing.T) {
	httpPort, zmqPort, replayPort := freePort(t), freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	shm := shmName(t, "sub")
	srv := startServerKV(t, "kv-server", httpPort, zmqPort, shm,
		"--kv-events-endpoint", "tcp://127.0.0.1:*", "--kv-events-replay-endpoint", "tcp://127.0.0.1:"+itoa(replayPort), "--kv-events-topic", "kv")
	var pubEndpoint string
	re := regexp.MustCompile(`KV events publisher running.* endpoint=(tcp://127\.0\.0\.1:\d+)`)
	waitFor(t, "the publisher's endpoint in the log", func() bool {
		m := re.FindStringSubmatch(srv.Output(t))
		if m != nil {
			pubEndpoint = m[1]
		}
		return m != nil
	})

	sub := startKVSub(t, pubEndpoint, "tcp://127.0.0.1:"+itoa(replayPort), "--drop", "50:150", "--timeout", "300")

	w := dialWorker(t, zmqPort, shm)
	stored := map[uint64]uint64{} // hash -> parent
	// 336 prompts of 16 chunks: 5,376 chunks, over 10,000 events with the
	// L2 copies.
	for seed := range 336 {
		hs, ps := w.store(seed+1, 16)
		for i, h := range hs {
			stored[h] = ps[i]
		}
	}
	if len(stored) < 4000 {
		t.Fatalf("the server took %d of 5,376 chunks", len(stored))
	}
	// Write-behind: wait until every chunk is announced on STORAGE too.
	waitFor(t, "every chunk stored in L2", func() bool {
		recs, _, _ := w.pollAll(0)
		n := 0
		for _, r := range recs {
			if r["kind"] == kvevents.KindStored && r["medium"] == kvevents.MediumStorage {
				n++
			}
		}
		return n == len(stored)
	})
	beforeDeletes, cursor, _ := w.pollAll(0)

	var page struct {
		Entries []struct {
			Key objkey.Encoded `json:"key"`
		} `json:"entries"`
	}
	if code, _ := call(t, "GET", base+"/cache/objects?model_name=m&page_size=100", nil, nil, &page); code != http.StatusOK || len(page.Entries) != 100 {
		t.Fatalf("GET /cache/objects = %d, %d entries", code, len(page.Entries))
	}
	deleted := map[uint64]bool{}
	var keys []objkey.Encoded
	for _, e := range page.Entries {
		raw, err := hex.DecodeString(e.Key.ChunkHashHex)
		if err != nil {
			t.Fatal(err)
		}
		deleted[kvevents.ExternalHash(raw)] = true
		keys = append(keys, e.Key)
	}
	var del struct {
		OK bool `json:"ok"`
	}
	if code, _ := call(t, "DELETE", base+"/cache/objects", map[string]any{"tier": "l2", "keys": keys}, nil, &del); code != http.StatusOK || !del.OK {
		t.Fatalf("DELETE /cache/objects = %d %+v", code, del)
	}
	if code, _ := call(t, "POST", base+"/cache/clear", map[string]any{"tier": "l1", "force": true}, nil, nil); code != http.StatusOK {
		t.Fatalf("POST /cache/clear = %d", code)
	}
	// The clear and the deletes are synchronous: their records are in the
	// log when the calls return.
	after, _, _ := w.pollAll(cursor)
	log, _, lost := w.pollAll(0)
	if lost || len(log) != len(beforeDeletes)+len(after) {
		t.Fatalf("log: %d records (lost %v), %d before the deletes + %d after", len(log), lost, len(beforeDeletes), len(after))
	}

	var status struct {
		KV map[string]any `json:"kv_events"`
	}
	if code, _ := call(t, "GET", base+"/status", nil, nil, &status); code != http.StatusOK || status.KV["enabled"] != true ||
		status.KV["log_depth"] != float64(len(log)) || status.KV["log_capacity"] != float64(32768) ||
		status.KV["publisher_endpoint"] != pubEndpoint || status.KV["replay_endpoint"] != "tcp://127.0.0.1:"+itoa(replayPort) {
		t.Errorf("GET /status = %d, kv_events %v", code, status.KV)
	}

	// What the log says happened, per medium and kind.
	seen := map[string]map[uint64]int{}
	evictions := 0
	for i, r := range log {
		if r["seq"] != int64(i+1) {
			t.Fatalf("record %d has seq %v", i, r["seq"])
		}
		k := r["kind"].(string) + "/" + r["medium"].(string)
		if seen[k] == nil {
			seen[k] = map[uint64]int{}
		}
		for _, h := range r["block_hashes"].([]any) {
			seen[k][kvevents.ExternalHash(h.([]byte))]++
		}
		if i < len(beforeDeletes) && k == "removed/CPU" {
			evictions += len(r["block_hashes"].([]any))
		}
	}
	for _, k := range []string{"stored/CPU", "stored/STORAGE", "removed/CPU"} {
		if len(seen[k]) != len(stored) {
			t.Errorf("%s covers %d chunks, want the %d stored", k, len(seen[k]), len(stored))
		}
		for h, n := range seen[k] {
			if _, ok := stored[h]; !ok || n != 1 {
				t.Fatalf("%s: hash %#x seen %d times (stored by the worker: %v)", k, h, n, ok)
			}
		}
	}
	if !reflect.DeepEqual(seen["removed/STORAGE"], func() map[uint64]int {
		m := map[uint64]int{}
		for h := range deleted {
			m[h] = 1
		}
		return m
	}()) {
		t.Errorf("removed/STORAGE %d chunks, want the %d deleted", len(seen["removed/STORAGE"]), len(deleted))
	}
	if evictions == 0 {
		t.Error("no L1 eviction was announced before the clear (the workload overfills L1)")
	}

	// The router's view: exactly the log, in order, none lost.
	want := make([][]any, len(log))
	for i, r := range log {
		want[i] = vllmEvent(r)
	}
	if len(want) < 10000 {
		t.Fatalf("only %d events; the test needs 10,000", len(want))
	}
	out := sub.expect(t, len(want), 5*time.Minute)
	if len(out.Events) != len(want) {
		t.Fatalf("subscriber got %d events, the log has %d", len(out.Events), len(want))
	}
	lastSeq := int64(-1)
	for i, ev := range out.Events {
		seq, err := ev[0].(json.Number).Int64()
		if err != nil || seq < lastSeq {
			t.Fatalf("event %d has sequence %v after %v", i, ev[0], lastSeq)
		}
		lastSeq = seq
		if got := ev[1:]; !reflect.DeepEqual(got, want[i]) {
			t.Fatalf("event %d (seq %v) = %v, the log says %v", i, seq, got, want[i])
		}
		if ev[1] == "BlockStored" {
			h, _ := strconv.ParseUint(string(ev[2].([]any)[0].(json.Number)), 10, 64)
			if p := stored[h]; (p == 0) != (ev[3] == nil) || (p != 0 && ev[3] != num(p)) {
				t.Fatalf("event %d: parent %v, the worker's chain says %#x", i, ev[3], p)
			}
		}
	}
	if out.Stats["dropped"] != 100 || out.Stats["replayed"] < 100 {
		t.Errorf("subscriber stats %v: want 100 dropped and recovered by replay", out.Stats)
	}
	t.Logf("%d events in %v batches; subscriber stats %v; %d L1 evictions announced", len(want), lastSeq+1, out.Stats, evictions)
	if m := metricsText(t, base); strings.Contains(m, `lmcache_mp_kv_events_dropped_total{reason="publisher_queue_full"}`) ||
		strings.Contains(m, `lmcache_mp_kv_events_dropped_total{reason="log_overflow"}`) {
		t.Errorf("events were dropped:\n%s", grepLines(m, "kv_events_dropped"))
	}
}

func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// kvSub is a running scripts/interop/kv_events_sub.py: a KV-aware
// router's SUB on a server's native publisher.
type kvSub struct {
	in     io.WriteCloser
	done   chan error
	out    []byte // complete once done has been sent to
	stderr *strings.Builder
}

// kvSubReport is the subscriber's output: every event [seq, type, hashes,
// parent, token count, medium] in sequence order, and its counters.
type kvSubReport struct {
	Events [][]any        `json:"events"`
	Stats  map[string]int `json:"stats"`
}

// startKVSub starts the subscriber on endpoint (topic kv) and waits until
// it is subscribed; it is killed when the test ends.
func startKVSub(t *testing.T, endpoint, replay string, extra ...string) *kvSub {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	args := append([]string{filepath.Join(filepath.Dir(file), "..", "..", "scripts", "interop", "kv_events_sub.py"),
		"--endpoint", endpoint, "--replay", replay, "--topic", "kv"}, extra...)
	cmd := exec.Command("/usr/bin/python3", args...)
	s := &kvSub{done: make(chan error, 1), stderr: &strings.Builder{}}
	var err error
	if s.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("python3 subscriber: %v", err)
	}
	t.Cleanup(func() {
		_ = s.in.Close()
		_ = cmd.Process.Kill()
		<-s.done
	})
	lines := bufio.NewReader(stdout)
	line, err := lines.ReadString('\n')
	go func() {
		s.out, _ = io.ReadAll(lines)
		s.done <- cmd.Wait()
	}()
	if err != nil || line != "SUBSCRIBED\n" {
		t.Fatalf("subscriber said %q, %v; stderr %s", line, err, s.stderr.String())
	}
	return s
}

// expect tells the subscriber to stop after n events and returns its
// report; within bounds only a failing run.
func (s *kvSub) expect(t *testing.T, n int, within time.Duration) kvSubReport {
	t.Helper()
	fmt.Fprintf(s.in, "EXPECT %d\n", n)
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			t.Fatalf("subscriber: %v\n%s", err, s.stderr.String())
		}
	case <-time.After(within):
		t.Fatalf("subscriber did not finish; stderr %s", s.stderr.String())
	}
	var out kvSubReport
	dec := json.NewDecoder(strings.NewReader(string(s.out)))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("subscriber output: %v\n%.2000s", err, s.out)
	}
	return out
}

// TestKVEventsReplayRequestsFailedCounted: a real server with the native
// publisher and its replay socket gets two replay requests whose start
// sequence is 5 bytes instead of 8 over a real ZMQ DEALER, then a valid
// one. The valid one is answered with vLLM's end marker (sequence -1), and
// by then /metrics counts exactly the two invalid requests in
// lmcache_mp_kv_events_replay_requests_failed_total{reason="invalid"}, with
// no lmcache_mp_kv_events_dropped_total series: that counter is for events.
func TestKVEventsReplayRequestsFailedCounted(t *testing.T) {
	httpPort, zmqPort, replayPort := freePort(t), freePort(t), freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	startServerKV(t, "kv-replay-failed", httpPort, zmqPort, shmName(t, "replayfail"),
		"--kv-events-endpoint", "tcp://127.0.0.1:*", "--kv-events-replay-endpoint", "tcp://127.0.0.1:"+itoa(replayPort))

	dealer, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	if err := dealer.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := dealer.SetRcvtimeo(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Connect("tcp://127.0.0.1:" + itoa(replayPort)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := dealer.SendMessage("", []byte{0, 0, 0, 0, 1}); err != nil {
			t.Fatal(err)
		}
	}
	var start [8]byte
	if _, err := dealer.SendMessage("", start[:]); err != nil {
		t.Fatal(err)
	}
	// One DEALER is one ordered stream: the reply to the third request
	// means the first two were handled.
	msg, err := dealer.RecvMessageBytes(0)
	end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if err != nil || len(msg) != 3 || string(msg[1]) != string(end) {
		t.Fatalf("reply to the valid replay request %q, %v; want the end marker", msg, err)
	}
	m := metricsText(t, base)
	if got := grepLines(m, `lmcache_mp_kv_events_replay_requests_failed_total{`); got != `lmcache_mp_kv_events_replay_requests_failed_total{reason="invalid"} 2` {
		t.Errorf("replay failure series:\n%s\nwant exactly reason=\"invalid\" 2", got)
	}
	if got := grepLines(m, `lmcache_mp_kv_events_dropped_total{`); got != "" {
		t.Errorf("an invalid replay request was counted as dropped events:\n%s", got)
	}
}
