package kvevents

import (
	"context"
	"encoding/binary"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestIncarnationIsCreationTimeNs: a log's incarnation is the wall clock
// in nanoseconds at NewLog.
func TestIncarnationIsCreationTimeNs(t *testing.T) {
	before := time.Now().UnixNano()
	l, err := NewLog(4)
	after := time.Now().UnixNano()
	if err != nil {
		t.Fatal(err)
	}
	if inc := l.Incarnation(); inc < before || inc > after {
		t.Fatalf("incarnation %d not within [%d, %d]", inc, before, after)
	}
}

// TestLogOverflowCounted: each record a full log discards is counted once
// under log_overflow, and a poller from 0 is told lost.
func TestLogOverflowCounted(t *testing.T) {
	l, err := NewLog(2)
	if err != nil {
		t.Fatal(err)
	}
	var d drops
	r := NewRecorder(l, nil, 1, d.add)
	defer r.Close()
	for i := range 5 {
		r.Removed(MediumCPU, []objkey.Key{key(i, "m", 0, "")})
	}
	if got := d.get(DropLogOverflow); got != 3 {
		t.Fatalf("log_overflow %d, want 3 (5 records into a log of 2)", got)
	}
	recs, next, lost, err := l.ReadAfter(0, "m", 10)
	if err != nil || !lost || next != 5 || len(recs) != 2 || recs[0].Seq != 4 {
		t.Fatalf("ReadAfter(0): seqs %v next %d lost %v err %v; want [4 5] 5 true", seqs(recs), next, lost, err)
	}
}

// TestPublisherBindModes: ipc://, inproc:// and "::" endpoints bind (a
// tcp host endpoint connects, TestPublisherConnects), and Run logs the
// endpoint and mode once.
func TestPublisherBindModes(t *testing.T) {
	for _, ep := range []string{"ipc://" + filepath.Join(t.TempDir(), "kv.sock"), "inproc://kv-bindmode"} {
		logs := &logtest.Buffer{}
		p, err := NewPublisher(PublisherConfig{Endpoint: ep}, periodic.NewRegistry(), slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
		if p.mode != "bind" || p.Endpoint() != ep {
			t.Errorf("%s: mode %q endpoint %q, want bind and the same endpoint", ep, p.mode, p.Endpoint())
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		p.Run(ctx) // returns at once; closes the sockets
		out := logs.String()
		if n := strings.Count(out, "KV events publisher running"); n != 1 || !strings.Contains(out, "mode=bind") || !strings.Contains(out, "endpoint="+ep) {
			t.Errorf("%s: log %q, want one running line with mode=bind", ep, out)
		}
	}
	// An IPv6 spelling ("::") binds too; this one is 127.0.0.1, so the
	// bound endpoint names the IPv4 loopback and a real port.
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://[::ffff:127.0.0.1]:*"}, periodic.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.closeOnce.Do(p.close)
	if p.mode != "bind" || !strings.HasPrefix(p.Endpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(p.Endpoint(), ":*") {
		t.Errorf(":: endpoint: mode %q endpoint %q, want bind on tcp://127.0.0.1:<port>", p.mode, p.Endpoint())
	}
}

// TestPublisherLoopLevelMedium: the publishing loop is registered as
// kv_events_publisher at level medium.
func TestPublisherLoopLevelMedium(t *testing.T) {
	loops := periodic.NewRegistry()
	p, err := NewPublisher(PublisherConfig{Endpoint: "inproc://kv-level"}, loops, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.closeOnce.Do(p.close)
	st, ok := loops.Get("kv_events_publisher")
	if !ok || st.Level != "medium" {
		t.Fatalf("loop %+v %v, want level medium", st, ok)
	}
}

// TestPublisherSequenceFromZero: the first batch a publisher sends carries
// sequence 0 on the wire (read back through the replay socket, which has
// no slow-joiner loss), the next 1.
func TestPublisherSequenceFromZero(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{Endpoint: "inproc://kv-seq0", ReplayEndpoint: "tcp://127.0.0.1:*"}, periodic.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	p.Publish([]Record{removed("m", 1)})
	p.Publish([]Record{removed("m", 2)})
	dealer := dial(t, zmq.DEALER, p.ReplayEndpoint(), nil)
	_ = dealer.SetRcvtimeo(10 * time.Second)
	var start [8]byte // replay from sequence 0
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := dealer.SendMessage([]byte{}, start[:]); err != nil {
			t.Fatal(err)
		}
		var replayed []uint64
		for {
			msg, err := dealer.RecvMessageBytes(0)
			if err != nil {
				t.Fatalf("replay receive: %v", err)
			}
			if int64(binary.BigEndian.Uint64(msg[1])) == -1 {
				break
			}
			replayed = append(replayed, binary.BigEndian.Uint64(msg[1]))
		}
		if len(replayed) == 2 {
			if replayed[0] != 0 || replayed[1] != 1 {
				t.Fatalf("replayed sequences %v, want [0 1]", replayed)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replay still has %v after 30 s", replayed)
		}
	}
}
