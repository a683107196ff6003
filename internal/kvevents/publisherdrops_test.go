package kvevents

import (
	"context"
	"encoding/binary"
	"log/slog"
	"strings"
	"testing"

	zmq "github.com/pebbe/zmq4"

	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// get reads one reason's count under the lock.
func (d *drops) get(reason string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[reason]
}

// TestPublishFailureCounted: a batch the PUB socket refuses (a real error
// of the library: the socket is closed) is counted with its events under
// publish_failed, is still kept for replay, and the warning is logged once
// per interval. Run never started, so the test goroutine owns the sockets.
func TestPublishFailureCounted(t *testing.T) {
	logs := &logtest.Buffer{}
	p, err := NewPublisher(PublisherConfig{Endpoint: "inproc://kv-pubfail"}, periodic.NewRegistry(), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var d drops
	r := NewRecorder(nil, p, 1, d.add)
	defer r.Close()
	if err := p.pub.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p.send([]Record{removed("m", 2*i), removed("m", 2*i+1)})
	}
	if got := d.get(DropPublishFailed); got != 6 {
		t.Errorf("publish_failed counted %d events, want 6 (3 batches of 2)", got)
	}
	if len(p.buf) != 3 || p.seq != 3 {
		t.Errorf("replay buffer %d batches, seq %d; want 3, 3", len(p.buf), p.seq)
	}
	if n := strings.Count(logs.String(), "KV events publish failed"); n != 1 {
		t.Errorf("publish failure logged %d times, want 1", n)
	}
}

// TestInvalidReplayRequestCounted: over a real ZMQ DEALER, three replay
// requests with a 5-byte start sequence are each counted under
// replay_invalid_request and answered with nothing; the valid request
// that follows gets the end marker, which also shows (one DEALER, one
// ordered stream) that the three were handled. One warning is logged.
func TestInvalidReplayRequestCounted(t *testing.T) {
	logs := &logtest.Buffer{}
	var d drops
	r, err := New(Config{Loops: periodic.NewRegistry(), Dropped: d.add, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Publisher: PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	dealer := dial(t, zmq.DEALER, r.Publisher().ReplayEndpoint(), func(s *zmq.Socket) error { return s.SetRcvtimeo(10e9) })
	defer dealer.Close()
	for range 3 {
		if _, err := dealer.SendMessage("", []byte{0, 0, 0, 0, 1}); err != nil {
			t.Fatal(err)
		}
	}
	var start [8]byte
	if _, err := dealer.SendMessage("", start[:]); err != nil {
		t.Fatal(err)
	}
	msg, err := dealer.RecvMessageBytes(0)
	if err != nil || len(msg) != 3 || string(msg[1]) != string(endSeq) {
		t.Fatalf("reply to the valid request %q, %v; want the end marker", msg, err)
	}
	if got := d.get(DropReplayInvalid); got != 3 {
		t.Errorf("replay_invalid_request counted %d, want 3", got)
	}
	if got := d.get(DropReplayAborted); got != 0 {
		t.Errorf("replay_aborted counted %d, want 0", got)
	}
	if n := strings.Count(logs.String(), "invalid KV events replay request"); n != 1 {
		t.Errorf("invalid request logged %d times, want 1", n)
	}
}

// TestReplayAbortedCounted: a replay client that never reads. Its inproc
// pipe holds the replay socket's high-water mark (BufferSteps + 16 = 80)
// plus its own (1): the first replay of the 64 retained batches and the
// end marker (65 messages) fits, the second is cut short when the pipe is
// full and the third fails at its first batch. With mandatory routing
// each abort is a send error, counted once per replay under
// replay_aborted, and logged once. Run never started, so the test drives
// serveReplay.
func TestReplayAbortedCounted(t *testing.T) {
	logs := &logtest.Buffer{}
	p, err := NewPublisher(PublisherConfig{Endpoint: "inproc://kv-abort-pub", ReplayEndpoint: "inproc://kv-abort-replay", BufferSteps: 64},
		periodic.NewRegistry(), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var d drops
	r := NewRecorder(nil, p, 1, d.add)
	defer r.Close()
	for i := range 64 {
		p.send([]Record{removed("m", i)})
	}
	dealer, err := p.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	for _, set := range []func() error{func() error { return dealer.SetLinger(0) }, func() error { return dealer.SetRcvhwm(1) },
		func() error { return dealer.Connect("inproc://kv-abort-replay") }} {
		if err := set(); err != nil {
			t.Fatal(err)
		}
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], 0)
	for range 3 {
		if _, err := dealer.SendMessage("", start[:]); err != nil {
			t.Fatal(err)
		}
	}
	if polled, err := p.poller.Poll(10e9); err != nil || len(polled) != 1 {
		t.Fatalf("replay socket poll: %v %v", polled, err)
	}
	// An aborted replay ends the call (the rest waits for the next cycle):
	// the first call serves replay 1 and aborts 2, the second aborts 3.
	p.serveReplay()
	if got := d.get(DropReplayAborted); got != 1 {
		t.Errorf("after one call replay_aborted counted %d, want 1", got)
	}
	p.serveReplay()
	if got := d.get(DropReplayAborted); got != 2 {
		t.Errorf("replay_aborted counted %d, want 2", got)
	}
	if got := d.get(DropReplayInvalid); got != 0 {
		t.Errorf("replay_invalid_request counted %d, want 0", got)
	}
	if n := strings.Count(logs.String(), "KV events replay aborted"); n != 1 {
		t.Errorf("aborted replay logged %d times, want 1", n)
	}
}
