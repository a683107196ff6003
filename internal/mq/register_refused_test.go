package mq_test

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestRefusedReRegistrationKeepsTheOld: a REGISTER_ENGINE_DRIVEN of an
// already registered instance that the engine refuses (an empty
// model_name: no layout can hold it) changes nothing. The worker's
// registration and its open PREPARE_STORE stay: the COMMIT_STORE that
// follows publishes the chunk, and a LOOKUP finds it.
func TestRefusedReRegistrationKeepsTheOld(t *testing.T) {
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	tokens := prompt(61, testChunk)
	k := key("m", 1, 0, tokens, 0, testChunk, "s")
	plan, err := w.c.PrepareStore(k, w.inst)
	if err != nil || len(plan.Slots) != 1 {
		t.Fatalf("PREPARE_STORE = %+v %v, want one slot", plan, err)
	}
	resp, err := w.c.Register(regPayload(w.inst, "", 1))
	if err != nil {
		t.Fatal(err)
	}
	if resp.ShmName != "" || wire.IsNilOrAbsent(resp.Error) {
		t.Fatalf("re-registration with an empty model_name answered %+v, want a refusal", resp)
	}
	w.fill(plan, 0, chunkData{}.of(61, 0))
	if ok, err := w.c.CommitStore(k, w.inst, nil); err != nil || !ok {
		t.Fatalf("COMMIT_STORE after the refused re-registration = %v %v, want true", ok, err)
	}
	lk := key("m", 1, -1, tokens, 0, testChunk, "r")
	lookupUntil(t, sched, lk, 1)
	freeLocks(t, sched, lk)
	if got := counterValue(h.srv.Metrics().ZMQAbandonedTransfers); got != 0 {
		t.Errorf("abandoned transfers %v, want 0", got)
	}
}
