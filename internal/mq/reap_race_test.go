package mq_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestReapSparesReRegisteredTransfers: the reaper takes a silent
// registration's transfers together with the registration. While it is
// still releasing another reaped worker's transfers (held here in the
// engine's AbortWrite), a reaped worker that registers again and
// prepares a store keeps that reservation: its COMMIT_STORE succeeds.
// (Taken after unlocking, the reaper aborted the new reservation of
// whichever worker it had not reached yet, and its COMMIT answered false.)
func TestReapSparesReRegisteredTransfers(t *testing.T) {
	h := start(t, opts{})
	g := newGate(h.eng, false, false)
	g.aborts = true
	srv := serveGatedSrv(t, g, mq.Config{WorkerRegistrationGrace: time.Second})
	clients := map[int64]*mqclient.Client{}
	for inst := range int64(2) {
		c, err := mqclient.Dial(srv.Endpoint(), mqclient.Options{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		clients[inst] = c
		if resp, err := c.Register(regPayload(inst, "m", 1)); err != nil || resp.ShmName == "" {
			t.Fatalf("REGISTER %d = %+v, %v", inst, resp, err)
		}
		// A pending store, so the reaper's release calls AbortWrite.
		if plan, err := c.PrepareStore(key("m", 1, 0, prompt(80+int(inst), testChunk), 0, testChunk, "old"), inst); err != nil || len(plan.Slots) != 1 {
			t.Fatalf("PREPARE_STORE %d = %+v, %v", inst, plan, err)
		}
	}
	// Both go silent; the reaper takes them after the grace and is held
	// in the first one's AbortWrite.
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the reaper did not reap the silent registrations")
	}
	keys := map[int64]*wire.Key{}
	for inst, c := range clients {
		if resp, err := c.Register(regPayload(inst, "m", 1)); err != nil || resp.ShmName == "" {
			t.Fatalf("re-REGISTER %d = %+v, %v", inst, resp, err)
		}
		k := key("m", 1, 0, prompt(90+int(inst), testChunk), 0, testChunk, fmt.Sprint("new", inst))
		if plan, err := c.PrepareStore(k, inst); err != nil || len(plan.Slots) != 1 {
			t.Fatalf("PREPARE_STORE %d after re-registering = %+v, %v", inst, plan, err)
		}
		keys[inst] = k
	}
	close(g.release)
	for inst, c := range clients {
		if ok, err := c.CommitStore(keys[inst], inst, nil); err != nil || !ok {
			t.Errorf("COMMIT_STORE %d of the store prepared after re-registering = %v, %v; want true", inst, ok, err)
		}
	}
}
