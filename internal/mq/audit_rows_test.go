package mq_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
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
