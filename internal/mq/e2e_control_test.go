package mq_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestPingPerProfile: PING answers in the type each generation declares,
// over the real socket. gen2m: bool True, whoever asks. gen3: an int, the
// server's boot token for a prober or a registered worker (the same value
// on every call, another value on another server process) and 2
// ("register again") for an instance the server does not know.
func TestPingPerProfile(t *testing.T) {
	h := start(t, opts{})
	g2 := h.dial(mqclient.Options{Profile: wire.Gen2M})
	for _, inst := range []wire.OptInt{{}, wire.SomeInt(77)} {
		b, err := g2.Call(wire.OpPing, wire.Marshal(inst))
		if err != nil || !bytes.Equal(b, wire.True) {
			t.Fatalf("gen2m PING(%v) = %x %v; want true", inst, b, err)
		}
	}
	w := h.worker(77, "m", 1, 0) // a gen3 worker
	var tokens []int64
	for _, inst := range []wire.OptInt{{}, wire.SomeInt(77), wire.SomeInt(77)} {
		r, err := w.c.PingReply(inst)
		if err != nil || !r.IsInt || r.Value <= 2 {
			t.Fatalf("gen3 PING(%v) = %+v %v; want a boot token", inst, r, err)
		}
		tokens = append(tokens, r.Value)
	}
	if tokens[0] != tokens[1] || tokens[1] != tokens[2] {
		t.Fatalf("boot token changed within one process: %v", tokens)
	}
	if r, err := w.c.PingReply(wire.SomeInt(78)); err != nil || !r.Untracked() {
		t.Fatalf("gen3 PING of an unknown instance = %+v %v; want 2", r, err)
	}
	// A restarted server (another process, here another server) answers
	// another token, so a client comparing tokens notices.
	other := start(t, opts{})
	c := other.dial(mqclient.Options{})
	if r, err := c.PingReply(wire.OptInt{}); err != nil || !r.IsInt || r.Value == tokens[0] || r.Value <= 2 {
		t.Fatalf("second server's PING = %+v %v; first server's token %d", r, err, tokens[0])
	}
	// By name (newest clients): the gen3 answer.
	n := h.dial(mqclient.Options{SendNames: true})
	if r, err := n.PingReply(wire.OptInt{}); err != nil || r.Value != tokens[0] {
		t.Fatalf("PING by name = %+v %v", r, err)
	}
}

// TestWireProfileForcedRefusesOtherClients: under a forced --wire-profile,
// a client whose first request is another numbering's GET_CHUNK_SIZE is
// refused: none of its requests is executed (a gen2m NOOP, 20, is gen3's
// CLEAR and must not clear anything) or answered, one error line is
// logged and the peer and its requests are counted.
func TestWireProfileForcedRefusesOtherClients(t *testing.T) {
	for _, tc := range []struct {
		forced, client *wire.Profile
		flag           string
		clearAs        wire.Op // the client's op whose number is CLEAR on the server
	}{
		{wire.Gen3, wire.Gen2M, mq.ProfileGen3, wire.OpNoop},
		{wire.Gen2M, wire.Gen3, mq.ProfileGen2M, wire.OpPrepareStore},
	} {
		t.Run(tc.client.Name+"_on_"+tc.forced.Name, func(t *testing.T) {
			h := start(t, opts{mq: func(c *mq.Config) { c.WireProfile = tc.flag }})
			h.clientOpts = mqclient.Options{Profile: tc.forced}
			w := h.worker(1, "m", 1, 0)
			c := w.c
			data := chunkData{}
			tokens := prompt(3, 2*testChunk)
			w.store(tokens, 0, 2*testChunk, "s", data.of(3, 0))
			lookupUntil(t, c, key("m", 1, -1, tokens, 0, 2*testChunk, "before"), 2)
			freeLocks(t, c, key("m", 1, -1, tokens, 0, 2*testChunk, "before"))

			sock := rawDealer(t, h.endpoint)
			csID, _ := tc.client.ID(wire.OpGetChunkSize)
			clearID, _ := tc.client.ID(tc.clearAs)
			if got, _ := tc.forced.Op(clearID); got != wire.OpClear {
				t.Fatalf("test premise: %d is %s on %s", clearID, got, tc.forced.Name)
			}
			for i, frames := range [][][]byte{
				{wire.EncodeInt(0), wire.EncodeInt(csID)},
				{wire.EncodeInt(1), wire.EncodeInt(clearID)},
				{wire.EncodeInt(2), wire.EncodeInt(clearID), wire.False},
			} {
				if _, err := sock.SendMessage(frames); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			m := h.srv.Metrics()
			deadline := time.Now().Add(10 * time.Second)
			for counterValue(m.ZMQRefused.WithLabelValues("wrong_wire_profile")) < 2 {
				if time.Now().After(deadline) {
					t.Fatal("the refused peer's requests were not counted")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if n := counterValue(m.ZMQProfileRefusedPeers); n != 1 {
				t.Errorf("refused peers counted %v, want 1", n)
			}
			// Nothing was cleared: the data is still there.
			lookupUntil(t, c, key("m", 1, -1, tokens, 0, 2*testChunk, "after"), 2)
			freeLocks(t, c, key("m", 1, -1, tokens, 0, 2*testChunk, "after"))
			if strings.Contains(h.logs.String(), "msg=CLEAR") {
				t.Error("CLEAR was executed for the refused peer")
			}
			// Nothing was answered.
			_ = sock.SetRcvtimeo(200 * time.Millisecond)
			if msg, err := sock.RecvMessageBytes(0); err == nil {
				t.Errorf("the refused peer got a reply %x", msg)
			}
			logs := h.logs.String()
			if n := strings.Count(logs, "client refused: its first request is GET_CHUNK_SIZE of another wire profile"); n != 1 {
				t.Errorf("%d refusal lines, want 1:\n%s", n, logs)
			}
			if !strings.Contains(logs, "client_profile="+tc.client.Name) {
				t.Error("the refusal does not name the client's profile")
			}
		})
	}
}

// TestStuckReaperIsUnhealthy: the reaper is a periodic loop at level high,
// so a reaper stuck in the engine (here: aborting a reaped worker's staged
// write) shows in /periodic-threads-health's list, and leaves it once it
// runs again.
func TestStuckReaperIsUnhealthy(t *testing.T) {
	base := start(t, opts{})
	g := newGate(base.eng, false, false)
	g.aborts = true
	loops := periodic.NewRegistry()
	srv := serveGatedSrv(t, g, mq.Config{WorkerReapTimeout: 200 * time.Millisecond, WorkerRegistrationGrace: time.Hour, Periodic: loops})
	h := &harness{t: t, eng: base.eng, endpoint: srv.Endpoint(), shmDir: base.shmDir, logs: base.logs}
	w := h.worker(5, "m", 1, 0)
	if ok, err := w.c.Ping(wire.SomeInt(5)); err != nil || !ok {
		t.Fatalf("PING = %v %v", ok, err)
	}
	if plan, err := w.c.PrepareStore(key("m", 1, 0, prompt(1, testChunk), 0, testChunk, "r"), 5); err != nil || len(plan.Slots) != 1 {
		t.Fatalf("PREPARE_STORE = %+v %v", plan, err)
	}
	<-g.entered // silent past 200 ms: reaped, and stuck aborting the write
	unhealthy := func() []string {
		var names []string
		for _, s := range periodic.Unhealthy(loops.All()) {
			names = append(names, s.Name)
		}
		return names
	}
	deadline := time.Now().Add(10 * time.Second)
	for got := unhealthy(); len(got) != 1 || got[0] != "lmcache-mp-worker-reaper"; got = unhealthy() {
		if time.Now().After(deadline) {
			t.Fatalf("unhealthy loops %v; want the stuck reaper", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(g.release)
	for got := unhealthy(); len(got) != 0; got = unhealthy() {
		if time.Now().After(deadline) {
			t.Fatalf("unhealthy loops %v after the reaper was released", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, ok := loops.Get("SessionManager-cleanup-thread-mq"); !ok || st.Level != periodic.Medium {
		t.Errorf("session sweep loop %+v %v", st, ok)
	}
}
