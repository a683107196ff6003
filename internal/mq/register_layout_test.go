package mq_test

import (
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
