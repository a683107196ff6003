package mq_test

import (
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestRegisterOverflowingLayoutRefused: a REGISTER whose chunk object
// size overflows int64 is refused with the one refusal a client
// understands (shm_name "") and registers nothing, whether the product
// wraps to 0 (which the engine refuses as a layout) or to a small
// positive size (slots whose length contradicts their shape). So is one
// whose layout the engine refuses (an empty model_name): its transfers
// would all be refused as unregistered after a success reply.
func TestRegisterOverflowingLayoutRefused(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	// One chunk object is 2 * layers * 16 * hidden * 2 = 64 * layers
	// bytes at hidden 1: 2^58 layers wrap it to 0, 2^58+1 to 64.
	for i, layers := range []wire.Int{1 << 58, 1<<58 + 1} {
		p := regPayload(int64(10+i), "m", 1)
		p.NumLayers, p.HiddenDimSize = layers, 1
		resp, err := c.Register(p)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ShmName != "" || wire.IsNilOrAbsent(resp.Error) {
			t.Fatalf("num_layers %d: REGISTER answered shm_name %q, error %x; want the refusal (shm_name \"\", an error)", layers, resp.ShmName, []byte(resp.Error))
		}
		if got := h.srv.Status().RegisteredGPUIDs; len(got) != 0 {
			t.Fatalf("num_layers %d: registered instances %v, want none", layers, got)
		}
	}
	resp, err := c.Register(regPayload(12, "", 1))
	if err != nil {
		t.Fatal(err)
	}
	if resp.ShmName != "" || wire.IsNilOrAbsent(resp.Error) {
		t.Fatalf("model_name \"\": REGISTER answered shm_name %q, error %x; want the refusal", resp.ShmName, []byte(resp.Error))
	}
	if got := h.srv.Status().RegisteredGPUIDs; len(got) != 0 {
		t.Fatalf("model_name \"\": registered instances %v, want none", got)
	}
}

// TestReRegistrationReplacesSameSizeLayout: a worker that registers its
// instance again with another layout whose chunk objects happen to have
// the same size (another dtype of the same width, another split of
// layers and hidden, MLA) gets slots of the new layout: the old shape
// and dtype would make it view the slots as tensors of the wrong type or
// shape.
func TestReRegistrationReplacesSameSizeLayout(t *testing.T) {
	h := start(t, opts{})
	c := h.dial(mqclient.Options{})
	for _, re := range []struct {
		name   string
		change func(*wire.RegisterPayload)
		shape  []wire.Int
		dtype  string
	}{
		{"dtype", func(p *wire.RegisterPayload) { p.DtypeStr = "bfloat16" }, []wire.Int{2, testLayers, testChunk, testHidden}, "bfloat16"},
		{"shape", func(p *wire.RegisterPayload) { p.NumLayers, p.HiddenDimSize = 2*testLayers, testHidden/2 }, []wire.Int{2, 2 * testLayers, testChunk, testHidden / 2}, "float16"},
		{"mla", func(p *wire.RegisterPayload) { p.UseMLA, p.HiddenDimSize = true, 2*testHidden }, []wire.Int{testLayers, testChunk, 2 * testHidden}, "float16"},
	} {
		t.Run(re.name, func(t *testing.T) {
			if resp, err := c.Register(regPayload(1, "m", 1)); err != nil || resp.ShmName == "" {
				t.Fatalf("REGISTER = %+v, %v", resp, err)
			}
			p := regPayload(1, "m", 1)
			re.change(p)
			if resp, err := c.Register(p); err != nil || resp.ShmName == "" {
				t.Fatalf("re-REGISTER = %+v, %v", resp, err)
			}
			k := key("m", 1, 0, prompt(61, testChunk), 0, testChunk, "r-"+re.name)
			plan, err := c.PrepareStore(k, 1)
			if err != nil || len(plan.Slots) != 1 {
				t.Fatalf("PREPARE_STORE = %+v, %v; want one slot", plan, err)
			}
			s := plan.Slots[0]
			if s.Dtype != re.dtype || !slices.Equal(s.Shape, re.shape) || s.Length != testObj {
				t.Fatalf("slot after re-registration: shape %v dtype %s length %d; want shape %v dtype %s length %d", s.Shape, s.Dtype, s.Length, re.shape, re.dtype, testObj)
			}
			if err := c.Unregister(1); err != nil { // aborts the reservation
				t.Fatal(err)
			}
		})
	}
}
