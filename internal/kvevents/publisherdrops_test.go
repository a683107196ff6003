package kvevents

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	zmq "github.com/pebbe/zmq4"

	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
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

// kvSeries scrapes m and returns its lmcache_mp_kv_events_* samples,
// one "name{labels} value" line each, in exposition order.
func kvSeries(t *testing.T, m *mpmetrics.Metrics) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var out []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, mpmetrics.Namespace+"_kv_events_") {
			out = append(out, line)
		}
	}
	return out
}

// TestInvalidReplayRequestCounted: over a real ZMQ DEALER, three replay
// requests with a 5-byte start sequence are each counted once in
// lmcache_mp_kv_events_replay_requests_failed_total{reason="invalid"}
// (wired through Config.ReplayFailed into a real registry) and answered
// with nothing; lmcache_mp_kv_events_dropped_total gets no series, since
// a request is not an event. The valid request that follows gets the end
// marker, which also shows (one DEALER, one ordered stream) that the
// three were handled. One warning is logged.
func TestInvalidReplayRequestCounted(t *testing.T) {
	logs := &logtest.Buffer{}
	m := mpmetrics.New("i-1", nil)
	r, err := New(Config{Loops: periodic.NewRegistry(), Dropped: m.KVEventsDrop, ReplayFailed: m.KVEventsReplayFailed,
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
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
	want := []string{`lmcache_mp_kv_events_replay_requests_failed_total{reason="invalid"} 3`}
	if got := kvSeries(t, m); !slices.Equal(got, want) {
		t.Errorf("kv_events series %q, want %q (and no dropped_total series)", got, want)
	}
	if n := strings.Count(logs.String(), "invalid KV events replay request"); n != 1 {
		t.Errorf("invalid request logged %d times, want 1", n)
	}
	if n := strings.Count(logs.String(), `lmcache_mp_kv_events_replay_requests_failed_total{reason=\"invalid\"}`); n != 1 {
		t.Errorf("the warning names the counter %d times, want 1:\n%s", n, logs.String())
	}
}

// TestReplayAbortedCounted: a replay client that never reads. Its inproc
// pipe holds the replay socket's high-water mark (BufferSteps + 16 = 80)
// plus its own (1): the first replay of the 64 retained batches and the
// end marker (65 messages) fits, the second is cut short when the pipe is
// full and the third fails at its first batch. With mandatory routing
// each abort is a send error, counted once per replay in
// lmcache_mp_kv_events_replay_requests_failed_total{reason="aborted"}
// (wired through Config.ReplayFailed into a real registry), never in
// lmcache_mp_kv_events_dropped_total, and logged once. Run never started,
// so the test drives serveReplay.
func TestReplayAbortedCounted(t *testing.T) {
	logs := &logtest.Buffer{}
	m := mpmetrics.New("i-1", nil)
	r, err := New(Config{Loops: periodic.NewRegistry(), Dropped: m.KVEventsDrop, ReplayFailed: m.KVEventsReplayFailed,
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
		Publisher: PublisherConfig{Endpoint: "inproc://kv-abort-pub", ReplayEndpoint: "inproc://kv-abort-replay", BufferSteps: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := r.Publisher()
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
	want := []string{`lmcache_mp_kv_events_replay_requests_failed_total{reason="aborted"} 1`}
	if got := kvSeries(t, m); !slices.Equal(got, want) {
		t.Errorf("after one call kv_events series %q, want %q", got, want)
	}
	p.serveReplay()
	want = []string{`lmcache_mp_kv_events_replay_requests_failed_total{reason="aborted"} 2`}
	if got := kvSeries(t, m); !slices.Equal(got, want) {
		t.Errorf("kv_events series %q, want %q (and no dropped_total series)", got, want)
	}
	if n := strings.Count(logs.String(), "KV events replay aborted"); n != 1 {
		t.Errorf("aborted replay logged %d times, want 1", n)
	}
	if n := strings.Count(logs.String(), `lmcache_mp_kv_events_replay_requests_failed_total{reason=\"aborted\"}`); n != 1 {
		t.Errorf("the warning names the counter %d times, want 1:\n%s", n, logs.String())
	}
}
