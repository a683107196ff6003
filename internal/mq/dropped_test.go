package mq

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// droppedReasons are the labels of lmcache_mp_zmq_dropped_replies_total.
var droppedReasons = []string{"peer_gone", "peer_not_reading", "send_failed", "handoff_failed"}

// unrunServer is a server whose Run is never started, so the test
// goroutine owns its sockets. At cleanup the sockets are closed and the
// engine is closed, failing the test with the keys of any reference left.
func unrunServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	eng, err := engine.New(engine.Config{L1SizeBytes: 1 << 20, ShmName: "mqdropped", ShmDir: t.TempDir()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = "127.0.0.1"
	s, err := New(cfg, eng, nil)
	if err != nil {
		_ = eng.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.closeSockets()
		if err := eng.CloseChecked(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// dropped is the dropped-replies counter by reason.
func dropped(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, r := range droppedReasons {
		var m dto.Metric
		if err := s.metrics.ZMQDroppedReplies.WithLabelValues(r).(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		out[r] = m.GetCounter().GetValue()
	}
	return out
}

// wantDropped fails unless the counter is want for every reason (absent
// reasons: 0), so each test also shows no reply was misfiled.
func wantDropped(t *testing.T, s *Server, want map[string]float64) {
	t.Helper()
	got := dropped(t, s)
	for _, r := range droppedReasons {
		if got[r] != want[r] {
			t.Errorf("dropped replies {reason=%s} = %v, want %v", r, got[r], want[r])
		}
	}
}

// TestDroppedRepliesAreCounted: a reply the ROUTER cannot deliver (its
// peer is gone: mandatory routing refuses an identity it has no
// connection for) is counted under reason peer_gone, on a real socket.
func TestDroppedRepliesAreCounted(t *testing.T) {
	s := unrunServer(t, Config{})
	for range 3 {
		s.sendRouter([][]byte{[]byte("gone-peer"), wire.EncodeInt(1), wire.EncodeInt(24), wire.OK})
	}
	wantDropped(t, s, map[string]float64{"peer_gone": 3})
}

// TestDroppedRepliesPeerNotReading: a connected peer that does not read
// its socket fills its send queue (SendHWM) and the TCP buffers; every
// reply sent after that is dropped and counted under peer_not_reading, on
// real sockets. Exactness: once the peer reads again it receives every
// reply that was not counted, so counted = sent - received.
func TestDroppedRepliesPeerNotReading(t *testing.T) {
	s := unrunServer(t, Config{SendHWM: 1})
	if err := s.router.SetRcvtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.router.SetSndtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	peer, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	for _, set := range []func() error{
		func() error { return peer.SetLinger(0) },
		func() error { return peer.SetIdentity("slow-peer") },
		func() error { return peer.SetRcvhwm(1) },
		func() error { return peer.SetRcvbuf(4096) },
		func() error { return peer.SetRcvtimeo(10 * time.Second) },
		func() error { return peer.Connect(s.Endpoint()) },
	} {
		if err := set(); err != nil {
			t.Fatal(err)
		}
	}
	// The ROUTER knows the peer once a message of it arrived.
	if _, err := peer.SendMessage(wire.EncodeInt(0), wire.EncodeInt(24)); err != nil {
		t.Fatal(err)
	}
	msg, err := s.router.RecvMessageBytes(0)
	if err != nil || string(msg[0]) != "slow-peer" {
		t.Fatalf("first message %q, %v", msg, err)
	}
	id := msg[0]
	payload := make([]byte, 64<<10)
	sent := 0
	send := func() {
		s.sendRouter([][]byte{id, wire.EncodeInt(int64(sent)), wire.EncodeInt(24), payload})
		sent++
	}
	for dropped(t, s)["peer_not_reading"] == 0 {
		if sent == 100_000 {
			t.Fatal("100000 replies of 64 KiB sent to a peer that does not read, none dropped")
		}
		send()
	}
	for range 9 {
		send()
	}
	counted := dropped(t, s)["peer_not_reading"]

	// The peer reads again, up to an end marker the ROUTER sends blocking.
	received := make(chan int, 1)
	go func() {
		n := 0
		defer func() { received <- n }()
		for {
			m, err := peer.RecvMessageBytes(0)
			if err != nil {
				t.Errorf("peer receive after %d replies: %v", n, err)
				return
			}
			if string(m[0]) == "end" {
				return
			}
			n++
		}
	}()
	if _, err := s.router.SendMessage(id, "end", wire.EncodeInt(24), wire.OK); err != nil {
		t.Fatalf("end marker: %v", err)
	}
	got := <-received
	// At least the first drop; the later sends may find the queue emptied
	// a little by the I/O thread, which is why the total is compared.
	if counted < 1 || counted != float64(sent-got) {
		t.Fatalf("sent %d, received %d, counted %v dropped: want sent-received (at least 1)", sent, got, counted)
	}
	wantDropped(t, s, map[string]float64{"peer_not_reading": counted})
}

// TestDroppedRepliesSendFailed: a send error other than an unknown peer
// or a full queue (here a real one: the socket is closed, ENOTSOCK-like)
// is counted under send_failed. Run never sends after it closed the
// socket, so in service this is a guard for errors libzmq does not
// document for a non-blocking ROUTER send.
func TestDroppedRepliesSendFailed(t *testing.T) {
	s := unrunServer(t, Config{})
	if err := s.router.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		s.sendRouter([][]byte{[]byte("any-peer"), wire.EncodeInt(1), wire.EncodeInt(24), wire.OK})
	}
	wantDropped(t, s, map[string]float64{"send_failed": 2})
}

// TestDroppedRepliesHandoffFailed: a handler goroutine's reply that the
// in-process PUSH socket refuses (here: closed, a real error of the
// library) is counted under handoff_failed. Run closes that socket only
// after every handler returned, so in service this is a guard.
func TestDroppedRepliesHandoffFailed(t *testing.T) {
	s := unrunServer(t, Config{})
	if err := s.push.Close(); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		s.replyAsync([]byte("any-peer"), wire.EncodeInt(1), wire.EncodeInt(24), wire.OK)
	}
	wantDropped(t, s, map[string]float64{"handoff_failed": 4})
}
