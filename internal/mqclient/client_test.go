package mqclient

import (
	"testing"
	"time"
)

// TestDialRefusesNegativeTimeout: the ZMQ poller reads a negative timeout
// as "wait forever", so a negative Options.Timeout would make every call
// on a silent server block without end; Dial refuses it, and zero still
// means the 30 s default.
func TestDialRefusesNegativeTimeout(t *testing.T) {
	// Connecting is asynchronous in ZMQ: nothing needs to listen here.
	const endpoint = "tcp://127.0.0.1:1"
	c, err := Dial(endpoint, Options{Timeout: -time.Second})
	if err == nil {
		_ = c.Close()
		t.Fatal("Dial accepted Timeout -1s (every call would wait forever)")
	}
	if want := "mqclient: timeout -1s: must be >= 0 (0 = 30s)"; err.Error() != want {
		t.Fatalf("Dial error %q, want %q", err, want)
	}
	c, err = Dial(endpoint, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.opts.Timeout != 30*time.Second {
		t.Fatalf("default timeout %v, want 30s", c.opts.Timeout)
	}
}
