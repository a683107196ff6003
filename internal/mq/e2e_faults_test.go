package mq_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/wire"
)

func TestLockExpiry(t *testing.T) {
	const ttl = 150 * time.Millisecond
	h := start(t, opts{eng: func(c *engine.Config) { c.L1ReadTTL = ttl }})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(3, 3*testChunk)
	d := data.of(3, 0)
	w.store(tokens, 0, 3*testChunk, "s", d)
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 3*testChunk, "r1"), 3)
	// The lookup's read locks expire after the TTL: the retrieve that
	// comes too late is refused instead of reading a slot nobody protects.
	// Leases expire when next checked, so sleeping past the TTL cannot
	// make this flaky; a slow machine only sleeps longer.
	before := h.eng.Counters().L1ReadLeasesExpired
	time.Sleep(3 * ttl)
	if w.retrieve(tokens, 0, 3*testChunk, "r1", d) {
		t.Fatal("PREPARE_RETRIEVE succeeded after the read locks expired")
	}
	if n := h.eng.Counters().L1ReadLeasesExpired - before; n < 1 {
		t.Fatal("no read lease expired: the retrieve was refused for another reason")
	}
	// A fresh lookup locks again and the data is intact. The fresh lease
	// is only ttl long, so a loaded machine may let it lapse before the
	// retrieve: try again rather than depend on the scheduler.
	for attempt := 0; ; attempt++ {
		rid := fmt.Sprint("r2-", attempt)
		lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 3*testChunk, rid), 3)
		if w.retrieve(tokens, 0, 3*testChunk, rid, d) {
			break
		}
		if attempt == 20 {
			t.Fatal("retrieve after a fresh lookup failed 20 times")
		}
	}
}

func TestEvictionWhileReadersHoldLocks(t *testing.T) {
	// 32 objects fit; eviction starts at 50% and runs every 5 ms.
	h := start(t, opts{eng: func(c *engine.Config) {
		c.L1SizeBytes = 32 * testObj
		c.EvictionTriggerWatermark = 0.5
		c.EvictionRatio = 0.5
		c.EvictionInterval = 5 * time.Millisecond
	}})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	const n = 8
	locked := prompt(100, n*testChunk)
	dl := data.of(100, 0)
	w.store(locked, 0, n*testChunk, "a", dl)
	lookupUntil(t, sched, key("m", 1, -1, locked, 0, n*testChunk, "reader"), n)

	// Write 10 more prompts (80 objects) through a 32-object pool. Stores
	// may be refused while eviction catches up; the locked prompt must
	// survive untouched.
	first := prompt(200, n*testChunk)
	refused := 0
	for p := 200; p < 210; p++ {
		toks := prompt(p, n*testChunk)
		for attempt := 0; ; attempt++ {
			k := key("m", 1, 0, toks, 0, n*testChunk, "w")
			plan, err := w.c.PrepareStore(k, w.inst)
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Slots) == 0 { // a fresh prompt: refused until eviction frees room
				refused++
				if attempt > 500 {
					t.Fatalf("prompt %d: PREPARE_STORE refused %d times", p, attempt)
				}
				time.Sleep(5 * time.Millisecond)
				continue
			}
			w.fill(plan, 0, data.of(p, 0))
			if ok, err := w.c.CommitStore(k, w.inst, nil); err != nil || !ok {
				t.Fatalf("commit: %v %v", ok, err)
			}
			break
		}
	}
	if !w.retrieve(locked, 0, n*testChunk, "reader", dl) {
		t.Fatal("the locked prompt could not be retrieved after memory pressure")
	}
	// The oldest unlocked prompt was evicted to make room.
	if got := lookupOnce(t, sched, key("m", 1, -1, first, 0, n*testChunk, "probe")); got == n {
		t.Fatalf("first unlocked prompt still fully resident (refusals %d); nothing was evicted", refused)
	}
	freeLocks(t, sched, key("m", 1, -1, first, 0, n*testChunk, "probe"))
	t.Logf("stores refused while eviction caught up: %d", refused)
}

func TestReapingSilentWorker(t *testing.T) {
	h := start(t, opts{mq: func(c *mq.Config) {
		c.WorkerReapTimeout = time.Second // long enough that PING -> PREPARE_STORE below never spans it
		c.WorkerRegistrationGrace = time.Hour
	}})
	w := h.worker(300, "m", 1, 0)
	quiet := h.worker(301, "m", 1, 0) // never pings: gets the long grace
	if ok, err := w.c.Ping(wire.SomeInt(300)); err != nil || !ok {
		t.Fatalf("PING = %v %v", ok, err)
	}
	tokens := prompt(5, 2*testChunk)
	k := key("m", 1, 0, tokens, 0, 2*testChunk, "r")
	plan, err := w.c.PrepareStore(k, w.inst)
	if err != nil || len(plan.Slots) != 2 {
		t.Fatalf("PREPARE_STORE: %+v %v", plan, err)
	}
	// Silence: the registration is reaped and its staged write aborted.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h.logs.String(), "reaped a silent worker registration") || !strings.Contains(h.logs.String(), "instance_id=300") {
		if time.Now().After(deadline) {
			t.Fatal("worker 300 was not reaped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := h.srv.Metrics()
	if n := counterValue(m.ZMQReapedWorkers); n != 1 {
		t.Errorf("reaped workers counted %v, want 1", n)
	}
	if n := counterValue(m.ZMQAbandonedTransfers); n != 1 {
		t.Errorf("abandoned transfers counted %v, want 1 (the staged write)", n)
	}
	// A gen3 worker's PING now says "register again" (2).
	if r, err := w.c.PingReply(wire.SomeInt(300)); err != nil || !r.Untracked() {
		t.Fatalf("PING of the reaped worker = %+v %v; want untracked", r, err)
	}
	if plan, err := w.c.PrepareStore(k, w.inst); err != nil || plan.Refused || len(plan.Slots) != 0 {
		t.Fatalf("PREPARE_STORE from a reaped worker: %+v %v", plan, err)
	}
	if ok, err := w.c.CommitStore(k, w.inst, nil); err != nil || ok {
		t.Fatalf("COMMIT_STORE from a reaped worker = %v %v", ok, err)
	}
	// The worker that never pinged is still registered.
	qk := key("m", 1, 0, prompt(6, testChunk), 0, testChunk, "q")
	if plan, err := quiet.c.PrepareStore(qk, quiet.inst); err != nil || len(plan.Slots) != 1 {
		t.Fatalf("the never-pinged worker was reaped: %+v %v", plan, err)
	}
	// Re-registering works, and the aborted reservation is gone: the same
	// chunks are handed out again.
	if _, err := w.c.Register(regPayload(300, "m", 1)); err != nil {
		t.Fatal(err)
	}
	if plan, err := w.c.PrepareStore(k, w.inst); err != nil || len(plan.Slots) != 2 {
		t.Fatalf("PREPARE_STORE after re-registration: %+v %v", plan, err)
	}
	if r, err := w.c.PingReply(wire.SomeInt(300)); err != nil || !r.IsInt || r.Value <= 2 {
		t.Fatalf("PING after re-registration = %+v %v; want the boot token", r, err)
	}
	// The reaper is a periodic loop that has run.
	st, ok := h.srv.Periodic().Get("lmcache-mp-worker-reaper")
	if !ok || !st.IsRunning || st.TotalRuns < 1 || st.Level != periodic.High {
		t.Fatalf("reaper loop status %+v (registered %v)", st, ok)
	}
}

func TestMalformedFrames(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	op := func(o wire.Op) []byte { b, _ := c.OpFrame(o); return b }
	uid := wire.EncodeInt(1000)
	sock := rawDealer(t, h.endpoint)
	// A message that is not a request gets no reply: the next request's
	// reply is the first thing that comes back.
	for i := range 50 {
		frames := [][]byte{uid}
		if i%2 == 1 {
			frames = append(frames, []byte{0xc1})
		}
		if _, err := sock.SendMessage(frames); err != nil {
			t.Fatal(err)
		}
	}
	rawSend(t, sock, 7, wire.OpNoop)
	if got, resp := rawRecv(t, sock); got != 7 || !bytes.Equal(resp, wire.OK) {
		t.Fatalf("first reply after garbage: uid %d %x; want NOOP's", got, resp)
	}
	m := h.srv.Metrics()
	if n := counterValue(m.ZMQMalformed.WithLabelValues("frames")); n != 25 {
		t.Errorf("malformed frames counted %v, want 25", n)
	}
	if n := counterValue(m.ZMQMalformed.WithLabelValues("op_frame")); n != 25 {
		t.Errorf("undecodable op frames counted %v, want 25", n)
	}
	// 50 bad messages from one peer: one warning per kind, not 50.
	logs := h.logs.String()
	if n := strings.Count(logs, "malformed message dropped"); n != 1 {
		t.Errorf("%d warnings for 25 malformed messages, want 1", n)
	}
	if n := strings.Count(logs, "undecodable op frame"); n != 1 {
		t.Errorf("%d warnings for 25 undecodable op frames, want 1", n)
	}

	cases := []struct {
		name   string
		frames [][]byte
		want   []byte
	}{
		{"prepare_store without payloads", [][]byte{uid, op(wire.OpPrepareStore)}, wire.NegativeReply(wire.OpPrepareStore)},
		{"prepare_store with a str key", [][]byte{uid, op(wire.OpPrepareStore), msgp.AppendString(nil, "k"), wire.EncodeInt(1)}, wire.NegativeReply(wire.OpPrepareStore)},
		{"prepare_retrieve with trailing bytes", [][]byte{uid, op(wire.OpPrepareRetrieve), {0x80, 0x01}, wire.EncodeInt(1)}, wire.NegativeReply(wire.OpPrepareRetrieve)},
		{"commit_store data as int", [][]byte{uid, op(wire.OpCommitStore), wire.Marshal(key("m", 1, 0, nil, 0, 0, "r")), wire.EncodeInt(1), wire.EncodeInt(5)}, wire.False},
		{"prepare_retrieve with a bad salt", [][]byte{uid, op(wire.OpPrepareRetrieve), wire.Marshal(saltKey("a@b")), wire.EncodeInt(1)}, wire.NegativeReply(wire.OpPrepareRetrieve)},
		{"prepare_store with a bad salt", [][]byte{uid, op(wire.OpPrepareStore), wire.Marshal(saltKey("a/b")), wire.EncodeInt(1)}, wire.NegativeReply(wire.OpPrepareStore)},
		{"commit_retrieve unknown instance", [][]byte{uid, op(wire.OpCommitRetrieve), wire.Marshal(key("m", 1, 0, nil, 0, 0, "r")), wire.EncodeInt(9)}, wire.False},
		{"lookup with garbage key", [][]byte{uid, op(wire.OpLookup), {0xc1}, wire.EncodeInt(1)}, wire.Nil},
		{"query with int request id", [][]byte{uid, op(wire.OpQueryPrefetchStatus), wire.EncodeInt(3)}, wire.EncodeInt(0)},
		{"ping with a str", [][]byte{uid, op(wire.OpPing), msgp.AppendString(nil, "x")}, wire.False},
		{"get_chunk_size with a payload", [][]byte{uid, op(wire.OpGetChunkSize), wire.EncodeInt(1)}, wire.Nil},
		{"lookup with too many frames", [][]byte{uid, op(wire.OpLookup), {0x80}, {0x01}, {0x01}}, wire.Nil},
	}
	for _, tc := range cases {
		r, err := c.Raw(tc.frames...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(r) != 3 || !bytes.Equal(r[0], uid) || !bytes.Equal(r[1], tc.frames[1]) || !bytes.Equal(r[2], tc.want) {
			t.Errorf("%s: reply %x, want [uid op %x]", tc.name, r, tc.want)
		}
	}
	// A bad registration is refused with shm_name "" and the reason.
	reg, err := c.Call(wire.OpRegisterEngineDriven, []byte{0x81, 0xa9, 'd', 't', 'y', 'p', 'e', '_', 's', 't', 'r', 0xa3, 'f', 'o', 'o'})
	if err != nil {
		t.Fatal(err)
	}
	var rr wire.RegisterResponse
	if err := wire.Unmarshal(reg, &rr); err != nil || rr.ShmName != "" || wire.IsNilOrAbsent(rr.Error) {
		t.Fatalf("bad registration reply %+v %v", rr, err)
	}
	// The server is still healthy.
	if ok, err := c.Ping(wire.OptInt{}); err != nil || !ok {
		t.Fatalf("PING after malformed frames = %v %v", ok, err)
	}
}

// TestUnknownOps: an op number unknown in the peer's numbering is answered
// with the negative reply its number has in the other numbering; an op no
// numbering knows, an unknown name or an undecodable op frame gets no
// reply. Never an error map.
func TestUnknownOps(t *testing.T) {
	h := start(t, opts{})
	cases := []struct {
		profile *wire.Profile
		op      []byte
		want    []byte // nil: no reply
	}{
		// gen2m has 28 ops; 29-34 are gen3's P2P_LOOKUP_AND_LOCK ..
		// POLL_KV_EVENTS (void replies) and 32 GET_EXPERIMENTAL.
		{wire.Gen2M, wire.EncodeInt(32), wire.EmptyList},
		{wire.Gen2M, wire.EncodeInt(34), wire.Nil},
		{wire.Gen2M, wire.EncodeInt(99), nil},
		{wire.Gen2M, msgp.AppendString(nil, "bogus_op"), nil},
		// gen3 has 34 ops; nothing is beyond.
		{wire.Gen3, wire.EncodeInt(99), nil},
		{wire.Gen3, wire.EncodeInt(-1), nil},
		{wire.Gen3, msgp.AppendString(nil, "bogus_op"), nil},
		{wire.Gen3, []byte{0xc3}, nil},
		{wire.Gen3, []byte{}, nil}, // a streaming ack/cancel frame
	}
	for i, tc := range cases {
		sock := rawDealer(t, h.endpoint)
		csID, _ := tc.profile.ID(wire.OpGetChunkSize)
		if _, err := sock.SendMessage(wire.EncodeInt(0), wire.EncodeInt(csID)); err != nil {
			t.Fatal(err)
		}
		if _, resp := rawRecv(t, sock); !bytes.Equal(resp, wire.EncodeInt(testChunk)) {
			t.Fatalf("case %d: GET_CHUNK_SIZE = %x", i, resp)
		}
		if _, err := sock.SendMessage(wire.EncodeInt(1), tc.op, wire.Nil); err != nil {
			t.Fatal(err)
		}
		noopID, _ := tc.profile.ID(wire.OpNoop)
		if _, err := sock.SendMessage(wire.EncodeInt(2), wire.EncodeInt(noopID)); err != nil {
			t.Fatal(err)
		}
		uid, resp := rawRecv(t, sock)
		switch {
		case tc.want == nil && (uid != 2 || !bytes.Equal(resp, wire.OK)):
			t.Errorf("case %d (%s op %x): got uid %d %x; want no reply, then NOOP's", i, tc.profile.Name, tc.op, uid, resp)
		case tc.want != nil && (uid != 1 || !bytes.Equal(resp, tc.want)):
			t.Errorf("case %d (%s op %x): got uid %d %x; want %x", i, tc.profile.Name, tc.op, uid, resp, tc.want)
		case tc.want != nil:
			rawRecv(t, sock) // NOOP's
		}
	}
	if n := counterValue(h.srv.Metrics().ZMQMalformed.WithLabelValues("unknown_op")); n != 7 {
		t.Errorf("unknown ops counted %v, want 7", n)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "unknown operation; no reply sent") || !strings.Contains(logs, "op=99") || !strings.Contains(logs, "bogus_op") ||
		!strings.Contains(logs, "undecodable op frame") || !strings.Contains(logs, "as=gen3/GET_EXPERIMENTAL") {
		t.Fatalf("unknown ops not logged:\n%s", logs)
	}
}

func TestRejectedRequests(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	ext := []byte{0xd4, 0x01, 0x00} // an ext-1 (pickled IPC wrapper) stand-in
	reg := [][]byte{wire.EncodeInt(7), {0x91, ext[0], ext[1], ext[2]}, msgp.AppendString(nil, "m"), wire.EncodeInt(1), wire.EncodeInt(1), wire.EmptyMap, wire.EmptyList}
	if b, err := c.Call(wire.OpRegisterKVCache, reg...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
	}
	k := wire.Marshal(key("m", 1, 0, prompt(1, testChunk), 0, testChunk, "r"))
	rejected := []byte{0x92, 0xc4, 0x00, 0xc2}
	if b, err := c.Call(wire.OpStore, k, wire.EncodeInt(7), []byte{0x91, 0x91, 0x01}, msgp.AppendBytes(nil, make([]byte, 64))); err != nil || !bytes.Equal(b, rejected) {
		t.Fatalf("STORE = %x %v", b, err)
	}
	if b, err := c.Call(wire.OpRetrieve, k, wire.EncodeInt(7), []byte{0x91, 0x91, 0x01}, msgp.AppendBytes(nil, nil), wire.EncodeInt(0)); err != nil || !bytes.Equal(b, rejected) {
		t.Fatalf("RETRIEVE = %x %v", b, err)
	}
	// Pickle-mode commit: the worker sends the chunks in the data frame.
	w := h.worker(8, "m", 1, 0)
	tokens := prompt(1, testChunk)
	kk := key("m", 1, 0, tokens, 0, testChunk, "r")
	if plan, err := w.c.PrepareStore(kk, w.inst); err != nil || len(plan.Slots) != 1 {
		t.Fatalf("PREPARE_STORE %+v %v", plan, err)
	}
	if ok, err := w.c.CommitStore(kk, w.inst, []byte("\x80\x04pickle")); err != nil || ok {
		t.Fatalf("pickle COMMIT_STORE = %v %v", ok, err)
	}
	// The refused reservation was dropped: the chunk is requested again.
	if plan, err := w.c.PrepareStore(kk, w.inst); err != nil || len(plan.Slots) != 1 {
		t.Fatalf("PREPARE_STORE after refused pickle commit %+v %v", plan, err)
	}
	// Hybrid (multi-group) registration: accepted, then refused transfers.
	hy := regPayload(9, "hybrid-m", 1)
	hy.EngineGroupInfos = []byte{0x92, 0x80, 0x80}
	resp, err := c.Register(hy)
	if err != nil || resp.ShmName == "" {
		t.Fatalf("hybrid registration reply %+v %v", resp, err)
	}
	if plan, err := c.PrepareStore(key("hybrid-m", 1, 0, tokens, 0, testChunk, "r"), 9); err != nil || len(plan.Slots) != 0 {
		t.Fatalf("hybrid PREPARE_STORE = %+v %v", plan, err)
	}
	if n := lookupOnce(t, c, key("hybrid-m", 1, -1, tokens, 0, testChunk, "r")); n != 0 {
		t.Fatalf("hybrid lookup hit %d", n)
	}
	logs := h.logs.String()
	for _, want := range []string{"refused REGISTER_KV_CACHE", "refused STORE", "refused RETRIEVE", "pickle-mode COMMIT_STORE", "hybrid (multi-group)"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if n := strings.Count(logs, "LMCACHE_MP_TRANSFER_MODE=engine_driven"); n < 5 {
		t.Errorf("only %d log lines tell the operator to set LMCACHE_MP_TRANSFER_MODE=engine_driven", n)
	}
	// Repeats are not logged again.
	if _, err := c.Call(wire.OpStore, k, wire.EncodeInt(7), []byte{0x90}, msgp.AppendBytes(nil, nil)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(h.logs.String(), "refused STORE"); got != 1 {
		t.Errorf("refused STORE logged %d times, want once per peer", got)
	}
}

// TestAbandonedTransfersAreDropped: a PREPARE whose COMMIT never comes is
// dropped once it is older than the session TTL, though its worker stays
// registered: the reservation is aborted and the read lock released.
func TestAbandonedTransfersAreDropped(t *testing.T) {
	h := start(t, opts{mq: func(c *mq.Config) { c.SessionTTL = time.Second }})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(31, 2*testChunk)
	d := data.of(31, 0)
	w.store(tokens, 0, 2*testChunk, "s", d)
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "r"), 2)
	rk := key("m", 1, 0, tokens, 0, 2*testChunk, "r")
	if ok, _, err := w.c.PrepareRetrieve(rk, w.inst); err != nil || !ok {
		t.Fatalf("PREPARE_RETRIEVE = %v %v", ok, err)
	}
	sk := key("m", 1, 0, prompt(32, testChunk), 0, testChunk, "s2")
	if plan, err := w.c.PrepareStore(sk, w.inst); err != nil || len(plan.Slots) != 1 {
		t.Fatalf("PREPARE_STORE = %+v %v", plan, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h.logs.String(), "dropped transfers whose COMMIT never came") {
		if time.Now().After(deadline) {
			t.Fatal("abandoned transfers were not dropped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := counterValue(h.srv.Metrics().ZMQAbandonedTransfers); n != 2 {
		t.Errorf("abandoned transfers counted %v, want 2", n)
	}
	if ok, err := w.c.CommitStore(sk, w.inst, nil); err != nil || ok {
		t.Fatalf("COMMIT_STORE after the drop = %v %v", ok, err)
	}
	if ok, err := w.c.CommitRetrieve(rk, w.inst); err != nil || ok {
		t.Fatalf("COMMIT_RETRIEVE after the drop = %v %v", ok, err)
	}
	// The worker is still registered and the data intact.
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "r2"), 2)
	if !w.retrieve(tokens, 0, 2*testChunk, "r2", d) {
		t.Fatal("retrieve after the drop failed")
	}
}

// saltKey is a one-chunk worker key with the given cache_salt.
func saltKey(salt string) *wire.Key {
	k := key("m", 1, 0, prompt(1, testChunk), 0, testChunk, "r")
	k.CacheSalt = salt
	return k
}
