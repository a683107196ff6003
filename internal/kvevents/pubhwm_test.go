package kvevents

import (
	"encoding/binary"
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/lmcache-go/lmcache/internal/periodic"
)

// hwmSub connects a SUB to all topics of endpoint in zctx with the given
// receive high-water mark.
func hwmSub(t *testing.T, zctx *zmq.Context, endpoint string, rcvhwm int) *zmq.Socket {
	t.Helper()
	s, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range []func() error{func() error { return s.SetLinger(0) }, func() error { return s.SetRcvhwm(rcvhwm) },
		func() error { return s.SetRcvtimeo(10 * time.Second) }, func() error { return s.SetSubscribe("") },
		func() error { return s.Connect(endpoint) }} {
		if err := set(); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// hwmSeqs reads up to max messages' sequence frames (frame 1) from s.
func hwmSeqs(s *zmq.Socket, flags zmq.Flag, max int) []uint64 {
	var out []uint64
	for len(out) < max {
		msg, err := s.RecvMessageBytes(flags)
		if err != nil || len(msg) < 2 || len(msg[1]) != 8 {
			break
		}
		out = append(out, binary.BigEndian.Uint64(msg[1]))
	}
	return out
}

func upTo(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i)
	}
	return out
}

// TestPubHWMDropsOnlyTheSlowSubscriber pins why PUB high-water-mark drops
// are not counted: libzmq's PUB accepts every send (no error, nothing to
// count) and drops only for the subscriber whose queue is full, while a
// reading subscriber gets every batch (TestXPubNodropHaltsEverySubscriber
// shows the alternative). Over inproc a pipe holds the PUB's HWM plus the
// SUB's (2 + 1): the slow subscriber gets batches 0-2 and sees the gap.
func TestPubHWMDropsOnlyTheSlowSubscriber(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{Endpoint: "inproc://kv-hwm", HWM: 2}, periodic.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var d drops
	r := NewRecorder(nil, p, 1, d.add)
	defer r.Close()
	slow, fast := hwmSub(t, p.zctx, "inproc://kv-hwm", 1), hwmSub(t, p.zctx, "inproc://kv-hwm", 1000)
	defer slow.Close()
	defer fast.Close()
	// An inproc SUB writes its subscription into the pipe as it connects;
	// reading ZMQ_EVENTS makes the PUB process the attach (and so the
	// subscription) now rather than at some later send.
	if _, err := p.pub.GetEvents(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		p.send([]Record{removed("m", i)})
	}
	if got := hwmSeqs(fast, 0, n); !slices.Equal(got, upTo(n)) {
		t.Errorf("reading subscriber got %v, want every batch %v", got, upTo(n))
	}
	if got := hwmSeqs(slow, zmq.DONTWAIT, n); !slices.Equal(got, upTo(3)) {
		t.Errorf("non-reading subscriber got %v, want %v (its pipe's 2 + 1)", got, upTo(3))
	}
	d.mu.Lock()
	counted := maps.Clone(d.n)
	d.mu.Unlock()
	if len(counted) != 0 || p.seq != n || len(p.buf) != n {
		t.Errorf("drops %v, seq %d, replay buffer %d; want none counted (PUB reported no error), %d, %d", counted, p.seq, len(p.buf), n, n)
	}
}

// TestXPubNodropHaltsEverySubscriber is the libzmq behaviour that keeps
// ZMQ_XPUB_NODROP out of the publisher: with it a DONTWAIT send does
// report the high-water mark (EAGAIN, exactly sent - received times), but
// one full subscriber refuses the message for all, so the reading
// subscriber gets only what the slow one had room for (3 of 20), and a
// stopped reader would halt the live stream for every router. (A blocking
// send, as Publisher.send's, would instead block the publishing loop.)
func TestXPubNodropHaltsEverySubscriber(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, set := range []func() error{func() error { return pub.SetLinger(0) }, func() error { return pub.SetSndhwm(2) },
		func() error { return pub.SetXpubNodrop(true) }, func() error { return pub.Bind("inproc://kv-nodrop") }} {
		if err := set(); err != nil {
			t.Fatal(err)
		}
	}
	slow, fast := hwmSub(t, zctx, "inproc://kv-nodrop", 1), hwmSub(t, zctx, "inproc://kv-nodrop", 1000)
	defer slow.Close()
	defer fast.Close()
	if _, err := pub.GetEvents(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	refused := 0
	for i := range n {
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], uint64(i))
		_, err := pub.SendMessageDontwait("", seq[:], "payload")
		switch {
		case err == nil:
		case zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN):
			refused++
		default:
			t.Fatalf("send %d: %v", i, err)
		}
	}
	slowGot := hwmSeqs(slow, zmq.DONTWAIT, n)
	fastGot := hwmSeqs(fast, zmq.DONTWAIT, n)
	if refused != n-len(slowGot) || refused != 17 || !slices.Equal(slowGot, upTo(3)) || !slices.Equal(fastGot, upTo(3)) {
		t.Errorf("refused %d, slow got %v, fast got %v; want 17 = 20 - 3 refused and batches 0-2 for both", refused, slowGot, fastGot)
	}
}
