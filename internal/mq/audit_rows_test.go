package mq_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// msgpackNil is the one-byte msgpack nil, the "`nil` + log" reply.
var msgpackNil = []byte{0xc0}

// TestUnsupportedKnownOpsReplyNil: each operation this server does not
// implement is answered with exactly the msgpack nil byte (0xc0) and one
// "not supported" log line naming it.
func TestUnsupportedKnownOpsReplyNil(t *testing.T) {
	h := start(t, opts{})
	cases := []struct {
		prof *wire.Profile
		ops  []wire.Op
	}{
		{wire.Gen3, []wire.Op{wire.OpRegisterQCache, wire.OpUnregisterQCache, wire.OpStoreQ, wire.OpCBRegisterRope,
			wire.OpCBUnregisterRope, wire.OpCBRetrievePreComputed, wire.OpCBUnifiedLookup, wire.OpP2PLookupAndLock,
			wire.OpP2PQueryLookupResults, wire.OpP2PUnlockObjects, wire.OpCBProtocolHandshake}},
		{wire.Gen2M, []wire.Op{wire.OpCBRegisterKVCache, wire.OpCBUnregisterKVCache, wire.OpCBStorePreComputed,
			wire.OpCBLookupPreComputed, wire.OpCBStoreFinal, wire.OpCBLookupPreComputedV2, wire.OpCBRetrievePreComputedV2}},
	}
	total := 0
	for _, tc := range cases {
		c, err := mqclient.Dial(h.endpoint, mqclient.Options{Profile: tc.prof, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetChunkSize(); err != nil {
			t.Fatal(err)
		}
		for _, op := range tc.ops {
			before := len(h.logs.String())
			b, err := c.Call(op, wire.Nil)
			if err != nil || !bytes.Equal(b, msgpackNil) {
				t.Errorf("%s %s = %x %v, want exactly c0", tc.prof.Name, op.EnumName(), b, err)
			}
			logs := h.logs.String()[before:]
			if n := strings.Count(logs, "operation not supported by this server"); n != 1 || !strings.Contains(logs, "op="+op.EnumName()) {
				t.Errorf("%s %s: %d not-supported lines naming it, want 1:\n%s", tc.prof.Name, op.EnumName(), n, logs)
			}
			total++
		}
		_ = c.Close()
	}
	if total != 18 {
		t.Fatalf("%d rejected ops checked, want 18", total)
	}
}

// serveGatedLogged is serveGatedSrv with the server's log captured.
func serveGatedLogged(t *testing.T, g *gatedEngine, cfg mq.Config) (*mq.Server, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	cfg.Host, cfg.ChunkSize = "127.0.0.1", testChunk
	srv, err := mq.New(cfg, g, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return srv, logs
}

// TestOverloadRefusalReadsAsZeroHits: a LOOKUP refused because the control
// queue is full reads as 0 hits to the scheduler's follow-up
// QUERY_PREFETCH_STATUS and QUERY_PREFETCH_LOOKUP_HITS, which are answered
// on the socket goroutine while the only control goroutine is held; the
// refusals log one line per peer.
func TestOverloadRefusalReadsAsZeroHits(t *testing.T) {
	h := start(t, opts{})
	g := newGate(h.eng, false, true)
	srv, logs := serveGatedLogged(t, g, mq.Config{MaxControlInFlight: 1, MaxQueued: 2, InlineLookupBytes: -1})
	if err := h.eng.RegisterLayout(engine.Layout{ModelName: "m", WorldSize: 1, ObjectBytes: testObj}); err != nil {
		t.Fatal(err)
	}
	a, b := rawDealer(t, srv.Endpoint()), rawDealer(t, srv.Endpoint())
	send := func(s int, uid int64) {
		sock := a
		if s == 1 {
			sock = b
		}
		rawSend(t, sock, uid, wire.OpLookup, wire.Marshal(key("m", 1, -1, prompt(int(uid), testChunk), 0, testChunk, fmt.Sprint("o", uid))), wire.EncodeInt(1))
	}
	for uid := int64(1); uid <= 5; uid++ {
		send(0, uid)
	}
	<-g.entered // the only control goroutine is held in the engine
	for want := int64(4); want <= 5; want++ {
		if uid, resp := rawRecv(t, a); uid != want || !bytes.Equal(resp, msgpackNil) {
			t.Fatalf("reply uid %d %x; want the refusal (c0) of %d", uid, resp, want)
		}
	}
	send(1, 6)
	if uid, resp := rawRecv(t, b); uid != 6 || !bytes.Equal(resp, msgpackNil) {
		t.Fatalf("peer b reply uid %d %x; want the refusal (c0) of 6", uid, resp)
	}
	// The refused LOOKUPs started no job: 0 hits, ready (msgpack 0).
	rawSend(t, a, 10, wire.OpQueryPrefetchStatus, msgp.AppendString(nil, "o4"))
	if uid, resp := rawRecv(t, a); uid != 10 || !bytes.Equal(resp, []byte{0x00}) {
		t.Fatalf("QUERY_PREFETCH_STATUS o4 = uid %d %x, want 10 00", uid, resp)
	}
	rawSend(t, b, 11, wire.OpQueryPrefetchLookupHits, msgp.AppendString(nil, "o6"))
	if uid, resp := rawRecv(t, b); uid != 11 || !bytes.Equal(resp, []byte{0x00}) {
		t.Fatalf("QUERY_PREFETCH_LOOKUP_HITS o6 = uid %d %x, want 11 00", uid, resp)
	}
	if n := counterValue(srv.Metrics().ZMQRefused.WithLabelValues("control_queue_full")); n != 3 {
		t.Errorf("refusals counted %v, want 3", n)
	}
	if n := strings.Count(logs.String(), "request refused: too many control requests waiting over all peers"); n != 2 {
		t.Errorf("%d refusal log lines for 3 refusals from 2 peers, want 2 (one per peer):\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "op=LOOKUP max_queued=2"); n != 2 {
		t.Errorf("%d refusal lines naming op=LOOKUP max_queued=2, want 2", n)
	}
	close(g.release)
	seen := map[int64]bool{}
	for range 3 {
		uid, resp := rawRecv(t, a)
		if !bytes.Equal(resp, msgpackNil) {
			t.Errorf("LOOKUP %d reply %x, want c0", uid, resp)
		}
		seen[uid] = true
	}
	if !seen[1] || !seen[2] || !seen[3] {
		t.Fatalf("admitted requests answered: %v", seen)
	}
}

// TestInlineLookupBytesThreshold: the default is 1 MiB; a LOOKUP key
// payload larger than InlineLookupBytes is handed to a control goroutine
// (the socket goroutine answers GET_CHUNK_SIZE while it is held, and the
// LOOKUP's reply comes only after its work), one at most that size is
// answered on the socket goroutine (its nil reply goes out before the work).
func TestInlineLookupBytesThreshold(t *testing.T) {
	if got := mq.Defaults().InlineLookupBytes; got != 1048576 {
		t.Fatalf("default InlineLookupBytes = %d, want 1048576", got)
	}
	h := start(t, opts{})
	if err := h.eng.RegisterLayout(engine.Layout{ModelName: "m", WorldSize: 1, ObjectBytes: testObj}); err != nil {
		t.Fatal(err)
	}
	k := wire.Marshal(key("m", 1, -1, prompt(3, testChunk), 0, testChunk, "big"))
	t.Run("larger key handed off", func(t *testing.T) {
		g := newGate(h.eng, false, true)
		srv, _ := serveGatedLogged(t, g, mq.Config{InlineLookupBytes: len(k) - 1})
		sock := rawDealer(t, srv.Endpoint())
		rawSend(t, sock, 1, wire.OpLookup, k, wire.EncodeInt(1))
		<-g.entered
		rawSend(t, sock, 2, wire.OpGetChunkSize)
		if uid, resp := rawRecv(t, sock); uid != 2 || !bytes.Equal(resp, wire.EncodeInt(testChunk)) {
			t.Fatalf("first reply uid %d %x; want GET_CHUNK_SIZE (2) = %d while the LOOKUP is held", uid, resp, testChunk)
		}
		close(g.release)
		if uid, resp := rawRecv(t, sock); uid != 1 || !bytes.Equal(resp, msgpackNil) {
			t.Fatalf("LOOKUP reply uid %d %x, want 1 c0", uid, resp)
		}
	})
	t.Run("key at the bound inline", func(t *testing.T) {
		g := newGate(h.eng, false, true)
		srv, _ := serveGatedLogged(t, g, mq.Config{InlineLookupBytes: len(k)})
		sock := rawDealer(t, srv.Endpoint())
		rawSend(t, sock, 1, wire.OpLookup, k, wire.EncodeInt(1))
		<-g.entered
		// The reply went out before the work the socket goroutine is now held in.
		if uid, resp := rawRecv(t, sock); uid != 1 || !bytes.Equal(resp, msgpackNil) {
			t.Fatalf("LOOKUP reply uid %d %x, want 1 c0 before its work", uid, resp)
		}
		close(g.release)
	})
}

// TestFreeLookupLocksNoOverRelease: a second FREE_LOOKUP_LOCKS of one
// request takes no lock another request's LOOKUP holds on the same chunks.
func TestFreeLookupLocksNoOverRelease(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	tokens := prompt(21, 4*testChunk)
	w.store(tokens, 0, 4*testChunk, "s", chunkData{}.of(21, 0))
	ka, kb := key("m", 1, -1, tokens, 0, 4*testChunk, "a"), key("m", 1, -1, tokens, 0, 4*testChunk, "b")
	lookupUntil(t, sched, ka, 4)
	if n := lookupOnce(t, sched, kb); n != 4 {
		t.Fatalf("LOOKUP b hit %d, want 4", n)
	}
	both := len(h.eng.Leaks())
	freeLocks(t, sched, ka)
	afterA := h.eng.Leaks()
	freeLocks(t, sched, ka) // duplicate: must not release b's locks
	freeLocks(t, sched, ka)
	if got := h.eng.Leaks(); !slices.Equal(got, afterA) || len(got) == 0 {
		t.Fatalf("duplicate FREE_LOOKUP_LOCKS of a changed the held references:\n before %v\n after %v (with both: %d)", afterA, got, both)
	}
	if both != 4 || len(afterA) != 4 {
		t.Fatalf("%d chunks referenced with both lookups, %d after a's free; want 4 and 4", both, len(afterA))
	}
	onlyLockedBy(t, "after a's free", afterA, "b")
	freeLocks(t, sched, kb)
	if got := h.eng.Leaks(); len(got) != 0 {
		t.Fatalf("references left after b's free: %v", got)
	}
}

// onlyLockedBy fails t unless every reference in refs (Engine.Leaks lines)
// is one read lock held by request holder.
func onlyLockedBy(t *testing.T, when string, refs []string, holder string) {
	t.Helper()
	for _, l := range refs {
		if !strings.HasSuffix(l, ": 1 readers, holders [{"+holder+" 1}]") {
			t.Fatalf("%s: %q, want only %s's one lock", when, l, holder)
		}
	}
}

// heldL2 is an fs adapter whose LookupAndLock waits until release is
// closed (or its context ends), signalling entered first: it keeps a
// LOOKUP's prefetch job running.
type heldL2 struct {
	l2.Adapter
	entered chan struct{}
	release chan struct{}
}

func (a *heldL2) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	select {
	case a.entered <- struct{}{}:
	default:
	}
	select {
	case <-a.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return a.Adapter.LookupAndLock(ctx, keys)
}

// TestWaitPrefetchStatusTimeoutAndConsume: WAIT_PREFETCH_STATUS answers
// nil (c0) when its timeout passes while the job still runs (the L2 tier
// is held), the hit count once it is done, and consumes the job: the next
// QUERY_PREFETCH_STATUS and QUERY_PREFETCH_LOOKUP_HITS answer 0.
func TestWaitPrefetchStatusTimeoutAndConsume(t *testing.T) {
	inner, err := fs.New(fs.Config{BasePath: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inner.Close() })
	a := &heldL2{Adapter: inner, entered: make(chan struct{}, 1), release: make(chan struct{})}
	h := start(t, opts{l2: []l2.Adapter{a}})
	released := false
	t.Cleanup(func() {
		if !released {
			close(a.release)
		}
	})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	tokens := prompt(31, 6*testChunk)
	w.store(tokens, 0, 4*testChunk, "s", chunkData{}.of(31, 0))
	k := key("m", 1, -1, tokens, 0, 6*testChunk, "w")
	if err := sched.Lookup(k, 1); err != nil {
		t.Fatal(err)
	}
	<-a.entered // the job asks L2 for chunks 4 and 5 and is held there
	b, err := sched.Call(wire.OpWaitPrefetchStatus, msgp.AppendString(nil, "w"), msgp.AppendFloat64(nil, 0.01))
	if err != nil || !bytes.Equal(b, msgpackNil) {
		t.Fatalf("WAIT_PREFETCH_STATUS while running = %x %v, want c0", b, err)
	}
	close(a.release)
	released = true
	b, err = sched.Call(wire.OpWaitPrefetchStatus, msgp.AppendString(nil, "w"), msgp.AppendFloat64(nil, 10))
	if err != nil || !bytes.Equal(b, wire.EncodeInt(4)) {
		t.Fatalf("WAIT_PREFETCH_STATUS when done = %x %v, want 04", b, err)
	}
	for _, op := range []wire.Op{wire.OpQueryPrefetchStatus, wire.OpQueryPrefetchLookupHits} {
		if b, err := sched.Call(op, msgp.AppendString(nil, "w")); err != nil || !bytes.Equal(b, []byte{0x00}) {
			t.Errorf("%s after WAIT consumed the job = %x %v, want 00", op.EnumName(), b, err)
		}
	}
	freeLocks(t, sched, k)
}

// TestEndSessionKeepsLocks: END_SESSION leaves the read locks its LOOKUP
// took; FREE_LOOKUP_LOCKS still releases them afterwards.
func TestEndSessionKeepsLocks(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	tokens := prompt(41, 3*testChunk)
	w.store(tokens, 0, 3*testChunk, "s", chunkData{}.of(41, 0))
	k := key("m", 1, -1, tokens, 0, 3*testChunk, "e")
	lookupUntil(t, sched, k, 3)
	if err := sched.EndSession("e"); err != nil {
		t.Fatal(err)
	}
	got := h.eng.Leaks()
	if len(got) != 3 {
		t.Fatalf("%d references after END_SESSION, want the lookup's 3: %v", len(got), got)
	}
	onlyLockedBy(t, "after END_SESSION", got, "e")
	freeLocks(t, sched, k)
	if got := h.eng.Leaks(); len(got) != 0 {
		t.Fatalf("references left after FREE_LOOKUP_LOCKS: %v", got)
	}
}

// TestRegisterEngineDrivenReplyAndReplace: the reply map has exactly
// shm_name, pool_size, scratch_offset 0, scratch_size 0 and error nil; a
// worker whose layout differs from the one already there (--register-model)
// is warned about; the same registration again is a refresh (same reply,
// no second "worker registered" line, the layout kept).
func TestRegisterEngineDrivenReplyAndReplace(t *testing.T) {
	h := start(t, opts{})
	if err := h.eng.RegisterLayout(engine.Layout{ModelName: "m", WorldSize: 1, ObjectBytes: 1234}); err != nil {
		t.Fatal(err)
	}
	c := h.dial(mqclient.Options{})
	first, err := c.Call(wire.OpRegisterEngineDriven, wire.Marshal(regPayload(5, "m", 1)))
	if err != nil {
		t.Fatal(err)
	}
	v, rest, err := msgp.ReadMapStrIntfBytes(first, nil)
	if err != nil || len(rest) != 0 {
		t.Fatalf("reply %x: %v", first, err)
	}
	pool := h.eng.Pool()
	if len(v) != 5 || v["shm_name"] != pool.Name || fmt.Sprint(v["pool_size"]) != fmt.Sprint(pool.Size) || fmt.Sprint(v["scratch_offset"]) != "0" || fmt.Sprint(v["scratch_size"]) != "0" || v["error"] != nil {
		t.Fatalf("registration reply %#v, want shm_name %q pool_size %d scratch_offset 0 scratch_size 0 error nil", v, pool.Name, pool.Size)
	}
	if n := strings.Count(h.logs.String(), `msg="a worker's layout replaces a different one`); n != 1 ||
		!strings.Contains(h.logs.String(), fmt.Sprintf("old_object_bytes=1234 object_bytes=%d", testObj)) {
		t.Fatalf("%d replace warnings, want 1 naming old_object_bytes=1234 object_bytes=%d:\n%s", n, testObj, h.logs.String())
	}
	again, err := c.Call(wire.OpRegisterEngineDriven, wire.Marshal(regPayload(5, "m", 1)))
	if err != nil || !bytes.Equal(again, first) {
		t.Fatalf("re-registration reply %x %v, want %x", again, err, first)
	}
	if n := strings.Count(h.logs.String(), `msg="worker registered (engine-driven, shared memory)"`); n != 1 {
		t.Fatalf("%d registration lines after a re-registration, want 1 (a refresh)", n)
	}
	if n := strings.Count(h.logs.String(), `msg="a worker's layout replaces a different one`); n != 1 {
		t.Fatalf("%d replace warnings after the refresh, want 1", n)
	}
	if l, err := h.eng.Layout("m", 1); err != nil || l.ObjectBytes != testObj {
		t.Fatalf("layout after refresh %+v %v, want %d-byte objects", l, err, testObj)
	}
	if err := c.Unregister(5); err != nil {
		t.Fatal(err)
	}
}

// TestUnregisterReleasesOpenTransfers: UNREGISTER of an instance with a
// PREPARE_STORE and a PREPARE_RETRIEVE open (no COMMIT) aborts the staged
// write and releases the pending read: no engine reference is left.
func TestUnregisterReleasesOpenTransfers(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	stored := prompt(51, 2*testChunk)
	w.store(stored, 0, 2*testChunk, "s", data.of(51, 0))
	lookupUntil(t, sched, key("m", 1, -1, stored, 0, 2*testChunk, "r"), 2)
	if ok, slots, err := w.c.PrepareRetrieve(key("m", 1, 0, stored, 0, 2*testChunk, "r"), w.inst); err != nil || !ok || len(slots) != 2 {
		t.Fatalf("PREPARE_RETRIEVE = %v, %d slots, %v", ok, len(slots), err)
	}
	plan, err := w.c.PrepareStore(key("m", 1, 0, prompt(52, 3*testChunk), 0, 3*testChunk, "w"), w.inst)
	if err != nil || len(plan.Slots) != 3 {
		t.Fatalf("PREPARE_STORE = %+v, %v; want 3 slots", plan, err)
	}
	if got := h.eng.Leaks(); len(got) != 5 {
		t.Fatalf("%d engine references with the transfers open, want 5 (2 reads, 3 staged writes): %v", len(got), got)
	}
	if err := w.c.Unregister(w.inst); err != nil {
		t.Fatal(err)
	}
	if got := h.eng.Leaks(); len(got) != 0 {
		t.Fatalf("references left after UNREGISTER: %v", got)
	}
}

// TestReaperIntervalAndSummary: the reaper runs every min(1 s, reap
// timeout / 4) (1 s when reaping is disabled) and its run summary is
// "reaped=<n> abandoned_transfers=<n>": a silent worker with one staged
// write gives "reaped=1 abandoned_transfers=1".
func TestReaperIntervalAndSummary(t *testing.T) {
	for _, tc := range []struct {
		reap time.Duration
		want float64
	}{{120 * time.Second, 1}, {8 * time.Second, 1}, {2 * time.Second, 0.5}, {0, 1}} {
		loops := periodic.NewRegistry()
		h := start(t, opts{mq: func(c *mq.Config) { c.WorkerReapTimeout, c.Periodic = tc.reap, loops }})
		h.dial(mqclient.Options{}) // answered once Run has registered its loops
		st, ok := loops.Get("lmcache-mp-worker-reaper")
		if !ok || st.Interval != tc.want || st.Level != periodic.High {
			t.Errorf("reap timeout %v: reaper %+v %v, want interval %v s, level high", tc.reap, st, ok, tc.want)
		}
		h.stop()
	}
	loops := periodic.NewRegistry()
	h := start(t, opts{mq: func(c *mq.Config) {
		c.WorkerReapTimeout, c.WorkerRegistrationGrace, c.Periodic = 2*time.Second, time.Hour, loops
	}})
	w := h.worker(5, "m", 1, 0)
	if ok, err := w.c.Ping(wire.SomeInt(5)); err != nil || !ok {
		t.Fatalf("PING = %v %v", ok, err)
	}
	if plan, err := w.c.PrepareStore(key("m", 1, 0, prompt(1, testChunk), 0, testChunk, "r"), 5); err != nil || len(plan.Slots) != 1 {
		t.Fatalf("PREPARE_STORE = %+v %v", plan, err)
	}
	idle := "reaped=0 abandoned_transfers=0"
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _ := loops.Get("lmcache-mp-worker-reaper")
		if msg, _ := st.LastSummary["message"].(string); msg != "" && msg != idle {
			if msg != "reaped=1 abandoned_transfers=1" {
				t.Fatalf("reaper summary %q, want reaped=1 abandoned_transfers=1", msg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reaper never reaped: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGen3OnlyNumbersFromGen2MAndAckFrames: a gen2m peer sending 29, 30,
// 31, 33 or 34 (gen3's P2P ops, CB_PROTOCOL_HANDSHAKE, POLL_KV_EVENTS) is
// answered with exactly the nil byte, each counted {kind="unknown_op"}; an
// empty op frame (a streaming ack/cancel frame) gets no reply and is
// counted {kind="op_frame"} exactly once.
func TestGen3OnlyNumbersFromGen2MAndAckFrames(t *testing.T) {
	h := start(t, opts{})
	sock := rawDealer(t, h.endpoint)
	csID, _ := wire.Gen2M.ID(wire.OpGetChunkSize)
	if _, err := sock.SendMessage(wire.EncodeInt(0), wire.EncodeInt(csID)); err != nil {
		t.Fatal(err)
	}
	if _, resp := rawRecv(t, sock); !bytes.Equal(resp, wire.EncodeInt(testChunk)) {
		t.Fatalf("GET_CHUNK_SIZE = %x", resp)
	}
	for _, n := range []int64{29, 30, 31, 33, 34} {
		if _, err := sock.SendMessage(wire.EncodeInt(n), wire.EncodeInt(n), wire.Nil); err != nil {
			t.Fatal(err)
		}
		if uid, resp := rawRecv(t, sock); uid != n || !bytes.Equal(resp, msgpackNil) {
			t.Errorf("gen2m op %d: reply uid %d %x, want c0", n, uid, resp)
		}
	}
	if _, err := sock.SendMessage(wire.EncodeInt(50), []byte{}, wire.Nil); err != nil {
		t.Fatal(err)
	}
	noopID, _ := wire.Gen2M.ID(wire.OpNoop)
	if _, err := sock.SendMessage(wire.EncodeInt(51), wire.EncodeInt(noopID)); err != nil {
		t.Fatal(err)
	}
	if uid, resp := rawRecv(t, sock); uid != 51 || !bytes.Equal(resp, wire.OK) {
		t.Fatalf("after the empty op frame: reply uid %d %x, want only NOOP's (51)", uid, resp)
	}
	if n := counterValue(h.srv.Metrics().ZMQMalformed.WithLabelValues("unknown_op")); n != 5 {
		t.Errorf("unknown ops counted %v, want 5", n)
	}
	if n := counterValue(h.srv.Metrics().ZMQMalformed.WithLabelValues("op_frame")); n != 1 {
		t.Errorf("op_frame malformed counted %v, want 1", n)
	}
}

// TestTransferModeRefusalsAndControlServed: under lmcache_driven each of the
// six engine-driven operations, under engine_driven each of REGISTER_KV_CACHE,
// STORE, RETRIEVE and UNREGISTER_KV_CACHE, gets exactly its negative reply
// and is counted {reason="transfer_mode"}; LOOKUP and the control
// operations are answered the same in all three modes and refused in none.
func TestTransferModeRefusalsAndControlServed(t *testing.T) {
	k := wire.Marshal(key("m", 1, 0, prompt(2, testChunk), 0, testChunk, "r"))
	lmdFrames := func(t *testing.T, op wire.Op) [][]byte {
		switch op {
		case wire.OpRegisterKVCache:
			return newPagedCache(t).registerFrames(t, 4)
		case wire.OpUnregisterKVCache:
			return [][]byte{wire.EncodeInt(4)}
		case wire.OpStore:
			return [][]byte{k, wire.EncodeInt(4), blockIDs(1), msgp.AppendBytes(nil, nil)}
		}
		return [][]byte{k, wire.EncodeInt(4), blockIDs(1), msgp.AppendBytes(nil, nil), wire.EncodeInt(0)}
	}
	edFrames := func(_ *testing.T, op wire.Op) [][]byte {
		switch op {
		case wire.OpRegisterEngineDriven:
			return [][]byte{wire.Marshal(regPayload(3, "m", 1))}
		case wire.OpUnregisterEngineDriven:
			return [][]byte{wire.EncodeInt(3)}
		case wire.OpCommitStore:
			return [][]byte{k, wire.EncodeInt(3), wire.Nil}
		}
		return [][]byte{k, wire.EncodeInt(3)}
	}
	refusals := []struct {
		mode   string
		ops    []wire.Op
		frames func(*testing.T, wire.Op) [][]byte
	}{
		{mq.ModeLMCacheDriven, []wire.Op{wire.OpRegisterEngineDriven, wire.OpUnregisterEngineDriven, wire.OpPrepareStore,
			wire.OpCommitStore, wire.OpPrepareRetrieve, wire.OpCommitRetrieve}, edFrames},
		{mq.ModeEngineDriven, []wire.Op{wire.OpRegisterKVCache, wire.OpStore, wire.OpRetrieve, wire.OpUnregisterKVCache}, lmdFrames},
		{mq.ModeAuto, nil, nil},
	}
	for _, tc := range refusals {
		t.Run(tc.mode, func(t *testing.T) {
			h := start(t, opts{mq: func(c *mq.Config) { c.TransferMode = tc.mode }})
			if err := h.eng.RegisterLayout(engine.Layout{ModelName: "m", WorldSize: 1, ObjectBytes: testObj}); err != nil {
				t.Fatal(err)
			}
			c := h.dial(mqclient.Options{})
			for _, op := range tc.ops {
				if b, err := c.Call(op, tc.frames(t, op)...); err != nil || !bytes.Equal(b, wire.NegativeReply(op)) {
					t.Errorf("%s under %s = %x %v, want its negative reply %x", op.EnumName(), tc.mode, b, err, wire.NegativeReply(op))
				}
			}
			if n := counterValue(h.srv.Metrics().ZMQRefused.WithLabelValues("transfer_mode")); n != float64(len(tc.ops)) {
				t.Fatalf("transfer_mode refusals counted %v, want %d", n, len(tc.ops))
			}
			lk := key("m", 1, -1, prompt(9, testChunk), 0, testChunk, "l")
			control := []struct {
				op     wire.Op
				frames [][]byte
				want   []byte
			}{
				{wire.OpGetChunkSize, nil, wire.EncodeInt(testChunk)},
				{wire.OpNoop, nil, wire.OK},
				{wire.OpLookup, [][]byte{wire.Marshal(lk), wire.EncodeInt(1)}, msgpackNil},
				{wire.OpWaitPrefetchStatus, [][]byte{msgp.AppendString(nil, "l"), msgp.AppendFloat64(nil, 10)}, []byte{0x00}},
				{wire.OpQueryPrefetchStatus, [][]byte{msgp.AppendString(nil, "nobody")}, []byte{0x00}},
				{wire.OpQueryPrefetchLookupHits, [][]byte{msgp.AppendString(nil, "nobody")}, []byte{0x00}},
				{wire.OpFreeLookupLocks, [][]byte{wire.Marshal(lk), wire.EncodeInt(1)}, msgpackNil},
				{wire.OpEndSession, [][]byte{msgp.AppendString(nil, "l")}, msgpackNil},
				{wire.OpClear, [][]byte{wire.EncodeBool(false)}, msgpackNil},
			}
			for _, cc := range control {
				if b, err := c.Call(cc.op, cc.frames...); err != nil || !bytes.Equal(b, cc.want) {
					t.Errorf("%s under %s = %x %v, want %x", cc.op.EnumName(), tc.mode, b, err, cc.want)
				}
			}
			if n := counterValue(h.srv.Metrics().ZMQRefused.WithLabelValues("transfer_mode")); n != float64(len(tc.ops)) {
				t.Errorf("transfer_mode refusals counted %v after the control ops, want %d", n, len(tc.ops))
			}
		})
	}
}

// mask is a one-group null_chunk_mask ([[b0, b1, ...]]).
func mask(null ...bool) msgp.Raw {
	b := msgp.AppendArrayHeader(nil, 1)
	b = msgp.AppendArrayHeader(b, uint32(len(null)))
	for _, v := range null {
		b = msgp.AppendBool(b, v)
	}
	return b
}

// TestNullChunksSkippedAndUnlockedRetrieves: PREPARE_STORE asks for no slot
// of a null_chunk_mask chunk; lmcache-driven STORE stores no null chunk and
// does not overwrite a chunk already in L1; RETRIEVE of chunks no LOOKUP
// locked is [b"", false], engine-driven PREPARE_RETRIEVE of them
// success=false.
func TestNullChunksSkippedAndUnlockedRetrieves(t *testing.T) {
	h := start(t, opts{})
	sched := h.dial(mqclient.Options{})
	w := h.worker(1, "m", 1, 0)

	// Engine-driven: chunk 1 of 3 is null.
	k := key("m", 1, 0, prompt(61, 3*testChunk), 0, 3*testChunk, "n")
	k.NullChunkMask = mask(false, true, false)
	plan, err := w.c.PrepareStore(k, w.inst)
	if err != nil || len(plan.Slots) != 2 || !slices.Equal(plan.ChunkIndices, []int{0, 2}) {
		t.Fatalf("PREPARE_STORE with chunk 1 null = %+v %v, want slots for chunks 0 and 2", plan, err)
	}
	if ok, err := w.c.CommitStore(k, w.inst, nil); err != nil || !ok {
		t.Fatalf("COMMIT_STORE = %v %v", ok, err)
	}
	nk := key("m", 1, -1, k.TokenIDs, 0, 3*testChunk, "n-look")
	if n := lookupOnce(t, sched, nk); n != 1 {
		t.Fatalf("LOOKUP after storing chunks 0 and 2 hit %d, want the prefix 1 (null chunk 1 not stored)", n)
	}
	freeLocks(t, sched, nk)

	// lmcache-driven.
	c := h.dial(mqclient.Options{})
	pc := newPagedCache(t)
	if b, err := c.Call(wire.OpRegisterKVCache, pc.registerFrames(t, 7)...); err != nil || !bytes.Equal(b, wire.Nil) {
		t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
	}
	tokens := prompt(62, 2*testChunk)
	lk := key("m", 1, 0, tokens, 0, 2*testChunk, "l")
	lk.NullChunkMask = mask(true, false)
	if b, err := c.Call(wire.OpStore, wire.Marshal(lk), wire.EncodeInt(7), blockIDs(1, 2, 3, 4), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferOK) {
		t.Fatalf("STORE with chunk 0 null = %x %v", b, err)
	}
	if n := lookupOnce(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "l0")); n != 0 {
		t.Fatalf("LOOKUP after a STORE whose chunk 0 is null hit %d, want 0 (chunk 0 not stored)", n)
	}
	freeLocks(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "l0"))

	// Chunk 0 of tokens2 stored from blocks 5, 6; a later STORE of both
	// chunks from blocks 9..12 keeps that object (already in L1).
	tokens2 := prompt(63, 2*testChunk)
	if b, err := c.Call(wire.OpStore, wire.Marshal(key("m", 1, 0, tokens2[:testChunk], 0, testChunk, "a")), wire.EncodeInt(7), blockIDs(5, 6), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferOK) {
		t.Fatalf("STORE of chunk 0 = %x %v", b, err)
	}
	if b, err := c.Call(wire.OpStore, wire.Marshal(key("m", 1, 0, tokens2, 0, 2*testChunk, "b")), wire.EncodeInt(7), blockIDs(9, 10, 11, 12), msgp.AppendBytes(nil, nil)); err != nil || !bytes.Equal(b, transferOK) {
		t.Fatalf("STORE of chunks 0-1 = %x %v", b, err)
	}
	if bytes.Equal(pc.object([]int{5, 6}), pc.object([]int{9, 10})) {
		t.Fatal("test blocks 5,6 and 9,10 hold the same bytes")
	}
	lookupUntil(t, sched, key("m", 1, -1, tokens2, 0, 2*testChunk, "c"), 2)
	want := [][]byte{pc.object([]int{5, 6}), pc.object([]int{11, 12})}
	if !w.retrieve(tokens2, 0, 2*testChunk, "c", func(i int) []byte { return want[i] }) {
		t.Fatal("PREPARE_RETRIEVE of the stored chunks failed")
	}

	// Nothing locked for request "u": both retrieve paths refuse.
	if b, err := c.Call(wire.OpRetrieve, wire.Marshal(key("m", 1, 0, tokens2, 0, 2*testChunk, "u")), wire.EncodeInt(7), blockIDs(13, 14, 15, 0), msgp.AppendBytes(nil, nil), wire.EncodeInt(0)); err != nil || !bytes.Equal(b, transferFailed) {
		t.Fatalf("RETRIEVE of unlocked chunks = %x %v, want [b\"\", false] %x", b, err, transferFailed)
	}
	b, err := w.c.Call(wire.OpPrepareRetrieve, wire.Marshal(key("m", 1, 0, tokens2, 0, 2*testChunk, "u")), wire.EncodeInt(w.inst))
	if err != nil || !bytes.Equal(b, wire.NegativeReply(wire.OpPrepareRetrieve)) {
		t.Fatalf("PREPARE_RETRIEVE of unlocked chunks = %x %v, want success=false %x", b, err, wire.NegativeReply(wire.OpPrepareRetrieve))
	}
	if ok, err := w.c.CommitRetrieve(key("m", 1, 0, tokens2, 0, 2*testChunk, "u"), w.inst); err != nil || ok {
		t.Fatalf("COMMIT_RETRIEVE after the refused PREPARE_RETRIEVE = %v %v, want false", ok, err)
	}
}
