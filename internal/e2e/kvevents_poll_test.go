package e2e

import (
	"fmt"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/wire"
)

func (w *kvWorker) experimental() string {
	w.t.Helper()
	resp, err := w.c.Call(wire.OpGetExperimental)
	if err != nil {
		w.t.Fatal(err)
	}
	v, _, err := msgp.ReadIntfBytes(resp)
	if err != nil {
		w.t.Fatal(err)
	}
	return fmt.Sprint(v)
}

// startPollServer starts a server with only L1 and the given log size.
func startPollServer(t *testing.T, name string, logSize int) (*proc, *kvWorker) {
	t.Helper()
	httpPort, zmqPort := freePort(t), freePort(t)
	shm := shmName(t, name)
	p := start(t, name, nil, "server", "--http-port", itoa(httpPort), "--port", itoa(zmqPort), "--chunk-size", itoa(chunkSize),
		"--l1-size-gb", "0.03125", "--shm-name", shm, "--kv-event-log-size", itoa(logSize))
	waitFor(t, name+" healthcheck", healthy("http://127.0.0.1:"+itoa(httpPort)+"/healthcheck"))
	return p, dialWorker(t, zmqPort, shm)
}

// TestKVEventsPollOverflowAndRestart drives POLL_KV_EVENTS on the real
// binary with --kv-event-log-size 64: GET_EXPERIMENTAL advertises
// kv_events; a poller that keeps up reads every stored chunk (records 1-32)
// and is never told lost; 80 more stores without a poll overflow the log,
// so the next poll from cursor 32 says lost and starts at the oldest
// retained record (49); after the resync nothing is lost; a restarted
// server has another incarnation and says lost to the old cursor; with
// --kv-event-log-size 0 nothing is advertised and polls answer
// enabled=false.
func TestKVEventsPollOverflowAndRestart(t *testing.T) {
	srv, w := startPollServer(t, "poll-a", 64)
	if got := w.experimental(); got != "[kv_events]" {
		t.Fatalf("GET_EXPERIMENTAL = %s", got)
	}
	cursor := int64(0)
	for seed := 1; seed <= 2; seed++ {
		hs, _ := w.store(seed, 16)
		p := w.poll(cursor, 100)
		if !p.Enabled || p.Lost || len(p.Records) != 16 || len(hs) != 16 {
			t.Fatalf("poll after store %d: enabled %v lost %v %d records (%d stored)", seed, p.Enabled, p.Lost, len(p.Records), len(hs))
		}
		for i, r := range p.Records {
			if r["seq"] != cursor+int64(i)+1 || r["kind"] != "stored" || r["medium"] != "CPU" || r["model_name"] != "m" || r["block_size"] != int64(chunkSize) {
				t.Fatalf("record %d: %v", i, r)
			}
		}
		cursor = p.Next
	}
	incarnation := w.poll(cursor, 1).Incarnation
	for seed := 3; seed <= 7; seed++ {
		w.store(seed, 16)
	}
	p := w.poll(cursor, 4096)
	if !p.Lost || p.Next != 112 || len(p.Records) != 64 || p.Records[0]["seq"] != int64(49) || p.Incarnation != incarnation {
		t.Fatalf("poll after the overflow: lost %v next %d, %d records from %v, incarnation %d (was %d)", p.Lost, p.Next, len(p.Records), p.Records[0]["seq"], p.Incarnation, incarnation)
	}
	if p := w.poll(p.Next, 4096); p.Lost || len(p.Records) != 0 || p.Next != 112 {
		t.Fatalf("poll after the resync: %+v", p)
	}
	srv.Stop(t)

	_, w2 := startPollServer(t, "poll-b", 64)
	if p := w2.poll(112, 10); !p.Lost || p.Next != 0 || p.Incarnation == incarnation {
		t.Fatalf("old cursor on a restarted server: lost %v next %d incarnation %d (was %d)", p.Lost, p.Next, p.Incarnation, incarnation)
	}

	_, w3 := startPollServer(t, "poll-off", 0)
	if got := w3.experimental(); got != "[]" {
		t.Errorf("GET_EXPERIMENTAL with the log off = %s", got)
	}
	w3.store(9, 4)
	if p := w3.poll(0, 10); p.Enabled || p.Lost || len(p.Records) != 0 {
		t.Errorf("poll with the log off: %+v", p)
	}
}
