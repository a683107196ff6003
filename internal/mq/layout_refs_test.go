package mq_test

import (
	"errors"
	"testing"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mqclient"
)

// TestLayoutReleasedWithLastRegistration, over the real ZMQ socket: a
// model's layout lives while any engine-driven worker registration holds
// it, so LOOKUP still hits after the first of two workers unregisters and
// reports no hits after the last; a new registration brings the stored
// chunks back. A layout given like --register-model (a static engine
// layout) stays when the workers of its model leave.
func TestLayoutReleasedWithLastRegistration(t *testing.T) {
	h := start(t, opts{})
	sched := h.dial(mqclient.Options{})
	data := chunkData{}
	tokens := prompt(5, 2*testChunk)
	lookup := func(model, id string) int {
		t.Helper()
		k := key(model, 1, -1, tokens, 0, 2*testChunk, id)
		n := lookupOnce(t, sched, k)
		if n > 0 {
			freeLocks(t, sched, k)
		}
		return n
	}

	w1 := h.worker(11, "m", 1, 0)
	w2 := h.worker(12, "m", 1, 0)
	w1.store(tokens, 0, 2*testChunk, "s", data.of(5, 0))
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "visible"), 2)
	freeLocks(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "visible"))
	if err := w1.c.Unregister(w1.inst); err != nil {
		t.Fatal(err)
	}
	if n := lookup("m", "one-left"); n != 2 {
		t.Fatalf("LOOKUP with one of two workers still registered hit %d chunks, want 2", n)
	}
	if err := w2.c.Unregister(w2.inst); err != nil {
		t.Fatal(err)
	}
	if n := lookup("m", "none-left"); n != 0 {
		t.Fatalf("LOOKUP after the last worker unregistered hit %d chunks, want 0", n)
	}
	if _, err := h.eng.Layout("m", 1); !errors.Is(err, engine.ErrNoLayout) {
		t.Fatalf("engine layout after the last unregistration: %v, want ErrNoLayout", err)
	}
	h.worker(13, "m", 1, 0)
	if n := lookup("m", "re-registered"); n != 2 {
		t.Fatalf("LOOKUP after a new registration hit %d chunks, want the 2 stored", n)
	}

	if err := h.eng.RegisterLayout(engine.Layout{ModelName: "static", WorldSize: 1, ObjectBytes: testObj}); err != nil {
		t.Fatal(err)
	}
	ws := h.worker(21, "static", 1, 0)
	ws.store(tokens, 0, 2*testChunk, "s", data.of(6, 0))
	lookupUntil(t, sched, key("static", 1, -1, tokens, 0, 2*testChunk, "static-visible"), 2)
	freeLocks(t, sched, key("static", 1, -1, tokens, 0, 2*testChunk, "static-visible"))
	if err := ws.c.Unregister(ws.inst); err != nil {
		t.Fatal(err)
	}
	if n := lookup("static", "static-after"); n != 2 {
		t.Fatalf("LOOKUP of a --register-model layout after its worker left hit %d chunks, want 2", n)
	}
}
