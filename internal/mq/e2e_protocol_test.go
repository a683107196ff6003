package mq_test

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/wire"
)

func TestWireProfilesAuto(t *testing.T) {
	h := start(t, opts{})
	data := chunkData{}
	for i, o := range []mqclient.Options{{Profile: wire.Gen2M}, {Profile: wire.Gen3}, {SendNames: true}} {
		c := h.dial(o) // GET_CHUNK_SIZE first: pins the profile
		if ok, err := c.Ping(wire.OptInt{}); err != nil || !ok {
			t.Fatalf("client %d PING = %v %v", i, ok, err)
		}
		if s, err := c.Noop(); err != nil || s != "OK" {
			t.Fatalf("client %d NOOP = %q %v", i, s, err)
		}
		// A full engine-driven cycle in this numbering.
		inst := int64(500 + i)
		if _, err := c.Register(regPayload(inst, "m", 1)); err != nil {
			t.Fatal(err)
		}
		pool, err := mqclient.OpenPool(h.shmDir, h.eng.Pool().Name, h.eng.Pool().Size)
		if err != nil {
			t.Fatal(err)
		}
		w := &worker{h: h, c: c, inst: inst, world: 1, pool: pool, model: "m"}
		tokens := prompt(40+i, 2*testChunk)
		d := data.of(40+i, 0)
		if n := w.store(tokens, 0, 2*testChunk, "s", d); n != 2 {
			t.Fatalf("client %d: PREPARE_STORE asked for %d chunks, want 2", i, n)
		}
		lookupUntil(t, c, key("m", 1, -1, tokens, 0, 2*testChunk, fmt.Sprint("r", i)), 2)
		if !w.retrieve(tokens, 0, 2*testChunk, fmt.Sprint("r", i), d) {
			t.Fatalf("client %d: retrieve failed", i)
		}
		_ = pool.Close()
	}
	logs := h.logs.String()
	for _, want := range []string{"profile=gen2m reason=\"first request GET_CHUNK_SIZE=17\"", "profile=gen3 reason=\"first request GET_CHUNK_SIZE=21\"", "profile=gen3 reason=\"first op sent by name\""} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	// A client whose first request is not GET_CHUNK_SIZE gets the default,
	// with a warning.
	c, err := mqclient.Dial(h.endpoint, mqclient.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ok, err := c.Ping(wire.OptInt{}); err != nil || !ok {
		t.Fatalf("PING first = %v %v", ok, err)
	}
	if !strings.Contains(h.logs.String(), "wire profile chosen by default") {
		t.Error("default profile choice not logged")
	}
}

func TestWireProfileForced(t *testing.T) {
	h := start(t, opts{mq: func(c *mq.Config) { c.WireProfile = mq.ProfileGen2M }})
	c := h.dial(mqclient.Options{Profile: wire.Gen2M})
	if ok, err := c.Ping(wire.OptInt{}); err != nil || !ok {
		t.Fatalf("PING = %v %v", ok, err)
	}
	if _, err := mq.New(mq.Config{WireProfile: "gen9"}, h.eng, nil); err == nil {
		t.Error("New accepted --wire-profile gen9")
	}
}

func TestArgumentCountsAcrossVersions(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	rid := msgp.AppendString(nil, "r")
	r, err := c.PingReply(wire.OptInt{})
	if err != nil || !r.IsInt || r.Value <= 2 {
		t.Fatalf("gen3 PING = %+v %v; want a boot token", r, err)
	}
	boot := wire.EncodeInt(r.Value)
	cases := []struct {
		op       wire.Op
		payloads [][]byte
		want     []byte
	}{
		{wire.OpEndSession, [][]byte{rid}, wire.Nil},
		{wire.OpEndSession, [][]byte{rid, wire.Marshal(&wire.SessionEndInfo{FinishReason: "stop", StopTokenID: 2})}, wire.Nil},
		{wire.OpClear, nil, wire.Nil},
		{wire.OpClear, [][]byte{wire.False}, wire.Nil},
		// gen3 PING: the boot token when healthy, 2 for an instance
		// that is not registered (TestPingPerProfile).
		{wire.OpPing, nil, boot},
		{wire.OpPing, [][]byte{wire.Nil}, boot},
		{wire.OpPing, [][]byte{wire.EmptyList}, boot},
		{wire.OpPing, [][]byte{wire.EncodeInt(1234)}, []byte{0x02}},
		{wire.OpGetExperimental, nil, wire.EmptyList},
		{wire.OpNoop, nil, wire.OK},
		{wire.OpReportBlockAllocation, [][]byte{wire.EncodeInt(1), msgp.AppendString(nil, "m"), {0x91, 0x83, 0xa6, 'r', 'e', 'q', '_', 'i', 'd', 0xa1, 'r', 0xad, 'n', 'e', 'w', '_', 'b', 'l', 'o', 'c', 'k', '_', 'i', 'd', 's', 0x90, 0xad, 'n', 'e', 'w', '_', 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0x90}}, wire.Nil},
		{wire.OpUnregisterKVCache, [][]byte{wire.EncodeInt(1)}, wire.Nil},
		{wire.OpUnregisterEngineDriven, [][]byte{wire.EncodeInt(424242)}, wire.Nil},
	}
	for _, tc := range cases {
		b, err := c.Call(tc.op, tc.payloads...)
		if err != nil || !bytes.Equal(b, tc.want) {
			t.Errorf("%s with %d frames = %x %v, want %x", tc.op, len(tc.payloads), b, err, tc.want)
		}
	}
}

func TestPrefetchQueries(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(9, 4*testChunk)
	w.store(tokens, 0, 4*testChunk, "s", data.of(9, 0))
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 4*testChunk, "warm"), 4)

	// Unknown request ids answer 0.
	if n, ready, err := sched.QueryPrefetchStatus("nobody"); err != nil || !ready || n != 0 {
		t.Fatalf("unknown id: %d %v %v", n, ready, err)
	}
	// LOOKUP_HITS peeks; STATUS consumes exactly once.
	k := key("m", 1, -1, tokens, 0, 4*testChunk, "q")
	if err := sched.Lookup(k, 1); err != nil {
		t.Fatal(err)
	}
	var hits int
	deadline := time.Now().Add(10 * time.Second)
	for ready := false; !ready; {
		var err error
		if hits, ready, err = sched.QueryPrefetchLookupHits("q"); err != nil {
			t.Fatal(err)
		}
		if !ready && time.Now().After(deadline) {
			t.Fatal("QUERY_PREFETCH_LOOKUP_HITS never ready")
		}
	}
	if hits != 4 {
		t.Fatalf("QUERY_PREFETCH_LOOKUP_HITS = %d", hits)
	}
	if n, ready, _ := sched.QueryPrefetchLookupHits("q"); !ready || n != 4 {
		t.Fatalf("second peek = %d %v", n, ready)
	}
	if n, ready, _ := sched.QueryPrefetchStatus("q"); !ready || n != 4 {
		t.Fatalf("QUERY_PREFETCH_STATUS = %d %v", n, ready)
	}
	if n, ready, _ := sched.QueryPrefetchStatus("q"); !ready || n != 0 {
		t.Fatalf("second QUERY_PREFETCH_STATUS = %d %v, want 0 (consumed)", n, ready)
	}
	// WAIT_PREFETCH_STATUS blocks until the job is done.
	if err := sched.Lookup(key("m", 1, -1, tokens, 0, 3*testChunk, "wait"), 1); err != nil {
		t.Fatal(err)
	}
	if n, ready, err := sched.WaitPrefetchStatus("wait", 5*time.Second); err != nil || !ready || n != 3 {
		t.Fatalf("WAIT_PREFETCH_STATUS = %d %v %v", n, ready, err)
	}
	// A model nobody registered hits nothing.
	if n := lookupOnce(t, sched, key("other", 1, -1, tokens, 0, 4*testChunk, "x")); n != 0 {
		t.Fatalf("unregistered model hit %d", n)
	}
	// CLEAR drops unlocked data.
	for _, id := range []string{"warm", "q", "wait"} {
		if err := sched.FreeLookupLocks(key("m", 1, -1, tokens, 0, 4*testChunk, id), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := sched.Clear(false); err != nil {
		t.Fatal(err)
	}
	if n := lookupOnce(t, sched, key("m", 1, -1, tokens, 0, 4*testChunk, "after-clear")); n != 0 {
		t.Fatalf("lookup after CLEAR hit %d", n)
	}
}

// TestConcurrentClients: 64 DEALERs with 16 requests each in flight at
// once, plus a worker storing and retrieving, against one server.
func TestConcurrentClients(t *testing.T) {
	h := start(t, opts{eng: func(c *engine.Config) { c.L1SizeBytes = 16 << 20 }})
	w := h.worker(1, "m", 1, 0)
	data := chunkData{}
	tokens := prompt(77, 4*testChunk)
	w.store(tokens, 0, 4*testChunk, "s", data.of(77, 0))
	// Wait until visible so every client's lookup expects 4.
	sched := h.dial(mqclient.Options{})
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 4*testChunk, "probe"), 4)
	freeLocks(t, sched, key("m", 1, -1, tokens, 0, 4*testChunk, "probe"))

	const clients, inFlight = 64, 16
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for ci := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pipelinedClient(h.endpoint, ci, inFlight, tokens)
		}()
	}
	// Meanwhile the worker keeps transferring.
	for i := range 5 {
		rid := fmt.Sprint("busy", i)
		lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 4*testChunk, rid), 4)
		if !w.retrieve(tokens, 0, 4*testChunk, rid, data.of(77, 0)) {
			t.Fatal("retrieve under load failed")
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// pipelinedClient sends n requests without waiting, then matches every
// reply to its uid (replies may come back out of order).
func pipelinedClient(endpoint string, ci, n int, tokens []wire.Int) error {
	sock, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		return err
	}
	defer sock.Close()
	_ = sock.SetLinger(0)
	_ = sock.SetRcvtimeo(20 * time.Second)
	if err := sock.Connect(endpoint); err != nil {
		return err
	}
	op := func(o wire.Op) []byte { id, _ := wire.Gen3.ID(o); return wire.EncodeInt(id) }
	want := map[string][]byte{}
	reqID := fmt.Sprint("c", ci)
	for i := range n {
		uid := wire.EncodeInt(int64(i))
		var frames [][]byte
		switch {
		case i == 0:
			frames = [][]byte{uid, op(wire.OpGetChunkSize)}
			want[string(uid)] = wire.EncodeInt(testChunk)
		case i == 1:
			frames = [][]byte{uid, op(wire.OpLookup), wire.Marshal(key("m", 1, -1, tokens, 0, 4*testChunk, reqID)), wire.EncodeInt(1)}
			want[string(uid)] = wire.Nil
		case i%3 == 0:
			frames = [][]byte{uid, op(wire.OpNoop)}
			want[string(uid)] = wire.OK
		default:
			frames = [][]byte{uid, op(wire.OpPing), wire.Nil}
			want[string(uid)] = nil // the boot token, any int > 2
		}
		if _, err := sock.SendMessage(frames); err != nil {
			return err
		}
	}
	for range n {
		msg, err := sock.RecvMessageBytes(0)
		if err != nil {
			return fmt.Errorf("client %d: %w (%d replies missing)", ci, err, len(want))
		}
		w, ok := want[string(msg[0])]
		if !ok || len(msg) != 3 {
			return fmt.Errorf("client %d: unexpected reply %x", ci, msg)
		}
		if w == nil {
			var boot wire.Int
			if err := wire.Unmarshal(msg[2], &boot); err != nil || boot <= 2 {
				return fmt.Errorf("client %d: PING reply %x is not a boot token", ci, msg[2])
			}
		} else if !bytes.Equal(msg[2], w) {
			return fmt.Errorf("client %d: unexpected reply %x", ci, msg)
		}
		delete(want, string(msg[0]))
	}
	// The lookup's job: 4 chunks, then release its locks.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := sock.SendMessage(wire.EncodeInt(1000), op(wire.OpQueryPrefetchStatus), msgp.AppendString(nil, reqID)); err != nil {
			return err
		}
		msg, err := sock.RecvMessageBytes(0)
		if err != nil {
			return err
		}
		if !bytes.Equal(msg[2], wire.Nil) {
			if !bytes.Equal(msg[2], wire.EncodeInt(4)) {
				return fmt.Errorf("client %d: lookup result %x, want 4", ci, msg[2])
			}
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("client %d: lookup never finished", ci)
		}
	}
	if _, err := sock.SendMessage(wire.EncodeInt(1001), op(wire.OpFreeLookupLocks), wire.Marshal(key("m", 1, -1, tokens, 0, 4*testChunk, reqID)), wire.EncodeInt(1)); err != nil {
		return err
	}
	_, err = sock.RecvMessageBytes(0)
	return err
}

func TestSlowTransferDoesNotBlockOthers(t *testing.T) {
	base := start(t, opts{}) // only for its engine
	be := newGate(base.eng, true, false)
	h := &harness{t: t, eng: base.eng, endpoint: serveGated(t, be, mq.Config{}), shmDir: base.shmDir, logs: base.logs}
	w := h.worker(1, "m", 1, 0)
	slow := make(chan error, 1)
	go func() {
		_, err := w.c.PrepareStore(key("m", 1, 0, prompt(1, testChunk), 0, testChunk, "r"), 1)
		slow <- err
	}()
	<-be.entered // the slow PREPARE_STORE is inside the engine

	// Other peers are served meanwhile: control requests and another
	// worker's registration.
	other := h.dial(mqclient.Options{})
	if ok, err := other.Ping(wire.OptInt{}); err != nil || !ok {
		t.Fatalf("PING during a slow transfer = %v %v", ok, err)
	}
	if n := lookupOnce(t, other, key("m", 1, -1, prompt(2, testChunk), 0, testChunk, "x")); n != 0 {
		t.Fatalf("lookup = %d", n)
	}
	if _, err := other.Register(regPayload(2, "m", 1)); err != nil {
		t.Fatal(err)
	}
	close(be.release)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
}

// TestUnsupportedKnownOps: every operation of each numbering is sent
// (with one nil payload frame) and the set answered as "not supported by
// this server" (their void reply, one log line each, never silence) is
// exactly the operations this server does not implement: the q-cache,
// CacheBlend and P2P ops of gen3, the CacheBlend ops of gen2m.
// POLL_KV_EVENTS and GET_EXPERIMENTAL are served: they are not in the set,
// and a well-formed POLL_KV_EVENTS gets its result map (enabled=false
// without --kv-event-log-size).
func TestUnsupportedKnownOps(t *testing.T) {
	h := start(t, opts{})
	notSupported := regexp.MustCompile(`msg="operation not supported by this server[^"]*".* op=([A-Z0-9_]+)`)
	sweep := func(prof *wire.Profile) []string {
		t.Helper()
		c, err := mqclient.Dial(h.endpoint, mqclient.Options{Profile: prof, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.GetChunkSize(); err != nil {
			t.Fatal(err)
		}
		before := len(h.logs.String())
		for id := int64(1); ; id++ {
			op, ok := prof.Op(id)
			if !ok {
				break
			}
			if _, err := c.Call(op, wire.Nil); err != nil {
				t.Errorf("%s %s: %v", prof.Name, op, err)
			}
		}
		var got []string
		for _, m := range notSupported.FindAllStringSubmatch(h.logs.String()[before:], -1) {
			got = append(got, m[1])
		}
		sort.Strings(got)
		return got
	}
	names := func(ops ...wire.Op) []string {
		out := make([]string, len(ops))
		for i, op := range ops {
			out[i] = op.EnumName()
		}
		sort.Strings(out)
		return out
	}
	if got, want := sweep(wire.Gen3), names(wire.OpRegisterQCache, wire.OpUnregisterQCache, wire.OpStoreQ, wire.OpCBRegisterRope,
		wire.OpCBUnregisterRope, wire.OpCBRetrievePreComputed, wire.OpCBUnifiedLookup, wire.OpP2PLookupAndLock,
		wire.OpP2PQueryLookupResults, wire.OpP2PUnlockObjects, wire.OpCBProtocolHandshake); !slices.Equal(got, want) {
		t.Errorf("gen3 ops answered as not supported:\n got %v\nwant %v", got, want)
	}
	if got, want := sweep(wire.Gen2M), names(wire.OpCBRegisterKVCache, wire.OpCBUnregisterKVCache, wire.OpCBStorePreComputed,
		wire.OpCBLookupPreComputed, wire.OpCBRetrievePreComputed, wire.OpCBStoreFinal, wire.OpCBLookupPreComputedV2,
		wire.OpCBRetrievePreComputedV2); !slices.Equal(got, want) {
		t.Errorf("gen2m ops answered as not supported:\n got %v\nwant %v", got, want)
	}
	c := h.dial(mqclient.Options{})
	b, err := c.Call(wire.OpPollKVEvents, msgp.AppendString(nil, "m"), msgp.AppendInt64(nil, 0), msgp.AppendInt64(nil, 10))
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := msgp.ReadIntfBytes(b)
	if m, ok := v.(map[string]any); err != nil || !ok || m["enabled"] != false || len(m["events"].([]any)) != 0 {
		t.Errorf("POLL_KV_EVENTS = %v %v, want a result map with enabled=false", v, err)
	}
}

// gatedEngine wraps the real engine and holds ReserveWrite (a slow
// transfer), Prefetch (a slow LOOKUP) and/or AbortWrite (a stuck reaper)
// until release is closed, signalling entered (without blocking) each time
// a call waits.
type gatedEngine struct {
	*engine.Engine
	writes, lookups, aborts bool
	entered                 chan struct{}
	release                 chan struct{}
}

func newGate(eng *engine.Engine, writes, lookups bool) *gatedEngine {
	return &gatedEngine{Engine: eng, writes: writes, lookups: lookups, entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (g *gatedEngine) wait(gated bool) {
	if !gated {
		return
	}
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.release
}

func (g *gatedEngine) ReserveWrite(tag string, keys []objkey.Key, sizes []int64) ([]engine.Slot, error) {
	g.wait(g.writes)
	return g.Engine.ReserveWrite(tag, keys, sizes)
}

func (g *gatedEngine) Prefetch(req engine.PrefetchRequest) error {
	g.wait(g.lookups)
	return g.Engine.Prefetch(req)
}

func (g *gatedEngine) AbortWrite(tag string, keys []objkey.Key) {
	g.wait(g.aborts)
	g.Engine.AbortWrite(tag, keys)
}

// serveGated runs another server over g until the test ends (releasing
// the gate first) and returns its endpoint.
func serveGated(t *testing.T, g *gatedEngine, cfg mq.Config) string {
	return serveGatedSrv(t, g, cfg).Endpoint()
}

// serveGatedSrv is serveGated returning the server (its log is kept and
// shown only if the test fails: serveGatedLogged).
func serveGatedSrv(t *testing.T, g *gatedEngine, cfg mq.Config) *mq.Server {
	t.Helper()
	srv, _ := serveGatedLogged(t, g, cfg)
	return srv
}

// rawDealer is a DEALER socket for pipelined requests.
func rawDealer(t *testing.T, endpoint string) *zmq.Socket {
	t.Helper()
	sock, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sock.Close() })
	_ = sock.SetLinger(0)
	_ = sock.SetRcvtimeo(10 * time.Second)
	if err := sock.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	return sock
}

// rawSend sends one gen3 request on sock without waiting for its reply.
func rawSend(t *testing.T, sock *zmq.Socket, uid int64, op wire.Op, payloads ...[]byte) {
	t.Helper()
	id, _ := wire.Gen3.ID(op)
	if _, err := sock.SendMessage(append([][]byte{wire.EncodeInt(uid), wire.EncodeInt(id)}, payloads...)); err != nil {
		t.Fatal(err)
	}
}

// rawRecv receives one reply and returns its uid and response frame.
func rawRecv(t *testing.T, sock *zmq.Socket) (int64, []byte) {
	t.Helper()
	msg, err := sock.RecvMessageBytes(0)
	if err != nil || len(msg) != 3 {
		t.Fatalf("reply %x %v", msg, err)
	}
	var uid wire.Int
	if err := wire.Unmarshal(msg[0], &uid); err != nil {
		t.Fatal(err)
	}
	return int64(uid), msg[2]
}

// TestOverloadIsRefused: requests beyond MaxQueued are answered at once
// with their negative reply instead of queueing without bound, for control
// requests over all peers and for one peer's transfer requests.
func TestOverloadIsRefused(t *testing.T) {
	h := start(t, opts{})
	t.Run("control", func(t *testing.T) {
		g := newGate(h.eng, false, true)
		// LOOKUPs handed off (InlineLookupBytes -1), so the gated engine
		// holds them on control goroutines, not on the socket goroutine.
		srv := serveGatedSrv(t, g, mq.Config{MaxControlInFlight: 1, MaxQueued: 2, InlineLookupBytes: -1})
		sock := rawDealer(t, srv.Endpoint())
		if err := h.eng.RegisterLayout(engine.Layout{ModelName: "m", WorldSize: 1, ObjectBytes: testObj}); err != nil {
			t.Fatal(err)
		}
		// One handled (held in the engine) and two waiting are admitted;
		// the next three are refused while the first three are held.
		for uid := int64(1); uid <= 6; uid++ {
			rawSend(t, sock, uid, wire.OpLookup, wire.Marshal(key("m", 1, -1, prompt(int(uid), testChunk), 0, testChunk, fmt.Sprint("o", uid))), wire.EncodeInt(1))
		}
		for want := int64(4); want <= 6; want++ {
			if uid, resp := rawRecv(t, sock); uid != want || !bytes.Equal(resp, wire.Nil) {
				t.Fatalf("reply uid %d %x; want the refusal of %d first", uid, resp, want)
			}
		}
		if n := counterValue(srv.Metrics().ZMQRefused.WithLabelValues("control_queue_full")); n != 3 {
			t.Errorf("refusals counted %v, want 3", n)
		}
		close(g.release)
		seen := map[int64]bool{}
		for range 3 {
			uid, _ := rawRecv(t, sock)
			seen[uid] = true
		}
		if !seen[1] || !seen[2] || !seen[3] {
			t.Fatalf("admitted requests answered: %v", seen)
		}
	})
	t.Run("transfer", func(t *testing.T) {
		g := newGate(h.eng, true, false)
		srv := serveGatedSrv(t, g, mq.Config{MaxQueued: 2})
		sock := rawDealer(t, srv.Endpoint())
		rawSend(t, sock, 0, wire.OpRegisterEngineDriven, wire.Marshal(regPayload(77, "m", 1)))
		if uid, _ := rawRecv(t, sock); uid != 0 {
			t.Fatalf("registration reply uid %d", uid)
		}
		prepare := func(uid int64) {
			k := key("m", 1, 0, prompt(int(uid), testChunk), 0, testChunk, fmt.Sprint("p", uid))
			rawSend(t, sock, uid, wire.OpPrepareStore, wire.Marshal(k), wire.EncodeInt(77))
		}
		prepare(1)
		<-g.entered // the first is running, held in the engine
		for uid := int64(2); uid <= 4; uid++ {
			prepare(uid)
		}
		if uid, resp := rawRecv(t, sock); uid != 4 || !bytes.Equal(resp, wire.NegativeReply(wire.OpPrepareStore)) {
			t.Fatalf("reply uid %d %x; want the refusal of 4 first", uid, resp)
		}
		if n := counterValue(srv.Metrics().ZMQRefused.WithLabelValues("transfer_queue_full")); n != 1 {
			t.Errorf("refusals counted %v, want 1", n)
		}
		close(g.release)
		for want := int64(1); want <= 3; want++ { // the peer's queue is FIFO
			if uid, resp := rawRecv(t, sock); uid != want || bytes.Equal(resp, wire.NegativeReply(wire.OpPrepareStore)) {
				t.Fatalf("reply uid %d %x; want slots for %d", uid, resp, want)
			}
		}
	})
}
