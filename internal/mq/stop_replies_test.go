package mq_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/polltest"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestRepliesAtStopAreDelivered: replies handlers produce while Run stops,
// after the socket loop has stopped reading them (a control request still
// waiting for a slot is refused then, a held one finishes), still go out
// before the sockets close. Before, they were left in the reply queue and
// discarded uncounted, and those clients waited for ever.
func TestRepliesAtStopAreDelivered(t *testing.T) {
	h := start(t, opts{})
	g := newGate(h.eng, false, true)
	cfg := mq.Config{Host: "127.0.0.1", ChunkSize: testChunk, MaxControlInFlight: 1, MaxQueued: 2, InlineLookupBytes: -1}
	logs := &logtest.Buffer{}
	srv, err := mq.New(cfg, g, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.eng.RegisterLayout(engine.Layout{ModelName: "m", WorldSize: 1, ObjectBytes: testObj}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	a := rawDealer(t, srv.Endpoint())
	for uid := int64(1); uid <= 2; uid++ {
		rawSend(t, a, uid, wire.OpLookup, wire.Marshal(key("m", 1, -1, prompt(int(uid), testChunk), 0, testChunk, "stop")), wire.EncodeInt(1))
	}
	<-g.entered // LOOKUP 1 holds the only control slot; LOOKUP 2 waits for it
	cancel()
	// The socket loop has stopped reading replies: LOOKUP 2 is refused
	// and LOOKUP 1 finishes only now.
	polltest.Until(t, 10*time.Second, "the socket loop to stop", func() bool { return logs.Has("data path stopping") })
	close(g.release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	seen := map[int64]bool{}
	for range 2 {
		uid, resp := rawRecv(t, a) // fails after the dealer's 10 s receive timeout
		if !bytes.Equal(resp, msgpackNil) {
			t.Errorf("LOOKUP %d reply %x, want c0", uid, resp)
		}
		seen[uid] = true
	}
	if !seen[1] || !seen[2] {
		t.Fatalf("replies received for %v, want LOOKUPs 1 and 2", seen)
	}
}
