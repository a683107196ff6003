package mq_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
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

// TestLMDLayoutReleasedWithLastRegistration, over the real ZMQ socket:
// lmcache-driven registrations (REGISTER_KV_CACHE of /dev/shm caches)
// hold their model's layout like engine-driven ones, in one count with
// them. LOOKUP hits while any registration of either path remains (an
// UNREGISTER_KV_CACHE or an engine-driven unregistration of one of
// three leaves the others' hits), reports none after the last, and hits
// again after a re-registration. While a registration holds the layout,
// one of another object size is refused on either path. A
// --register-model layout stays when its lmcache-driven workers leave.
func TestLMDLayoutReleasedWithLastRegistration(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	sched := h.dial(mqclient.Options{})
	pc := newPagedCache(t)
	tokens := prompt(31, 2*testChunk)
	register := func(inst int64, model string) {
		t.Helper()
		frames := pc.registerFrames(t, inst)
		frames[2] = msgp.AppendString(nil, model)
		if b, err := c.Call(wire.OpRegisterKVCache, frames...); err != nil || !bytes.Equal(b, wire.Nil) {
			t.Fatalf("REGISTER_KV_CACHE = %x %v", b, err)
		}
	}
	unregister := func(inst int64) {
		t.Helper()
		if b, err := c.Call(wire.OpUnregisterKVCache, wire.EncodeInt(inst)); err != nil || !bytes.Equal(b, wire.Nil) {
			t.Fatalf("UNREGISTER_KV_CACHE = %x %v", b, err)
		}
	}
	store := func(inst int64, model string) []byte {
		t.Helper()
		k := wire.Marshal(key(model, 1, 0, tokens, 0, len(tokens), "s"))
		b, err := c.Call(wire.OpStore, k, wire.EncodeInt(inst), blockIDs(1, 2, 3, 4), msgp.AppendBytes(nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	lookup := func(model, id string) int {
		t.Helper()
		k := key(model, 1, -1, tokens, 0, len(tokens), id)
		n := lookupOnce(t, sched, k)
		if n > 0 {
			freeLocks(t, sched, k)
		}
		return n
	}

	register(41, "m")
	register(42, "m")
	w := h.worker(43, "m", 1, 0) // an engine-driven worker of the same model
	if b := store(41, "m"); !bytes.Equal(b, transferOK) {
		t.Fatalf("STORE = %x", b)
	}
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, len(tokens), "visible"), 2)
	freeLocks(t, sched, key("m", 1, -1, tokens, 0, len(tokens), "visible"))

	// Another object size is refused while the layout is held.
	wide := regPayload(44, "m", 1)
	wide.HiddenDimSize = 2 * testHidden
	if resp, err := h.dial(mqclient.Options{}).Register(wide); err == nil && resp.ShmName != "" {
		t.Fatalf("an engine-driven registration of another object size was accepted: %+v", resp)
	}

	unregister(41)
	if n := lookup("m", "two-left"); n != 2 {
		t.Fatalf("LOOKUP with 2 of 3 registrations left hit %d chunks, want 2", n)
	}
	if err := w.c.Unregister(w.inst); err != nil {
		t.Fatal(err)
	}
	if n := lookup("m", "one-left"); n != 2 {
		t.Fatalf("LOOKUP with the last lmcache-driven registration left hit %d chunks, want 2", n)
	}
	unregister(42)
	if n := lookup("m", "none-left"); n != 0 {
		t.Fatalf("LOOKUP after the last registration left hit %d chunks, want 0", n)
	}
	if _, err := h.eng.Layout("m", 1); !errors.Is(err, engine.ErrNoLayout) {
		t.Fatalf("engine layout after the last unregistration: %v, want ErrNoLayout", err)
	}
	register(45, "m")
	if n := lookup("m", "re-registered"); n != 2 {
		t.Fatalf("LOOKUP after a new REGISTER_KV_CACHE hit %d chunks, want the 2 stored", n)
	}

	// The reverse conflict: an engine-driven worker of another object size
	// holds "wide"; an lmcache-driven registration of it is refused and
	// its stores fail.
	if resp, err := h.dial(mqclient.Options{}).Register(func() *wire.RegisterPayload {
		p := regPayload(46, "wide", 1)
		p.HiddenDimSize = 2 * testHidden
		return p
	}()); err != nil || resp.ShmName == "" {
		t.Fatalf("engine-driven registration of \"wide\" = %+v %v", resp, err)
	}
	register(47, "wide")
	if b := store(47, "wide"); !bytes.Equal(b, transferFailed) {
		t.Fatalf("STORE of a registration refused for its layout = %x", b)
	}
	if logs := h.logs.String(); !strings.Contains(logs, "layout conflict for (wide, world_size 1)") {
		t.Fatalf("the refused lmcache-driven registration does not log the conflict:\n%s", logs)
	}

	if err := h.eng.RegisterLayout(engine.Layout{ModelName: "static", WorldSize: 1, ObjectBytes: testObj}); err != nil {
		t.Fatal(err)
	}
	register(48, "static")
	if b := store(48, "static"); !bytes.Equal(b, transferOK) {
		t.Fatalf("STORE under a --register-model layout = %x", b)
	}
	lookupUntil(t, sched, key("static", 1, -1, tokens, 0, len(tokens), "static-visible"), 2)
	freeLocks(t, sched, key("static", 1, -1, tokens, 0, len(tokens), "static-visible"))
	unregister(48)
	if n := lookup("static", "static-after"); n != 2 {
		t.Fatalf("LOOKUP of a --register-model layout after its lmcache-driven worker left hit %d chunks, want 2", n)
	}
}
