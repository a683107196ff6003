package mqclient

import (
	"errors"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
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

// stalePeer is a fake server on a ROUTER socket. It answers nothing to
// the first request; after the second it keeps sending late replies to
// the first (its uid and op frame), one every interval, until stop is
// closed or it has sent limit of them, then reports how many it sent.
func stalePeer(t *testing.T, interval time.Duration, limit int, stop <-chan struct{}) (endpoint string, sent <-chan int) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(zmq.ROUTER)
	if err == nil {
		err = sock.SetLinger(0)
	}
	if err == nil {
		// Bounds the wait for a request that never comes (a broken test).
		err = sock.SetRcvtimeo(20 * time.Second)
	}
	if err == nil {
		err = sock.Bind("tcp://127.0.0.1:*")
	}
	if err == nil {
		endpoint, err = sock.GetLastEndpoint()
	}
	if err != nil {
		if sock != nil {
			_ = sock.Close()
		}
		_ = zctx.Term()
		t.Fatal(err)
	}
	out := make(chan int, 1)
	go func() {
		n := 0
		defer func() {
			_ = sock.Close()
			_ = zctx.Term()
			out <- n
		}()
		first, err := sock.RecvMessageBytes(0) // [identity, uid, op, ...]
		if err != nil || len(first) < 3 {
			return
		}
		if second, err := sock.RecvMessageBytes(0); err != nil || len(second) < 3 {
			return
		}
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for n < limit {
			if _, err := sock.SendMessage(first[0], first[1], first[2], []byte{0xc0}); err != nil {
				return
			}
			n++
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return endpoint, out
}

// TestCallDeadlineIgnoresLateReplies: a call's timeout runs from the
// call's start. Before, every late reply to an earlier, timed-out call
// restarted the wait, so a server that kept sending them held the call
// for as long as it kept sending. The peer sends one every timeout/20 and
// gives up after limit of them (about 10 s); the call must time out while
// the peer is still sending, not after the peer has gone silent.
func TestCallDeadlineIgnoresLateReplies(t *testing.T) {
	const (
		timeout = 200 * time.Millisecond
		limit   = 1000
	)
	stop := make(chan struct{})
	endpoint, sent := stalePeer(t, timeout/20, limit, stop)
	c, err := Dial(endpoint, Options{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Call 0 gets no answer and times out; its late replies then arrive
	// while call 1 waits.
	if _, err := c.Noop(); !errors.Is(err, ErrTimeout) {
		close(stop)
		<-sent
		t.Fatalf("call 0 on a silent peer: %v, want ErrTimeout", err)
	}
	_, err = c.Noop()
	close(stop)
	n := <-sent
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("call 1 among late replies: %v, want ErrTimeout", err)
	}
	if want := "noop: " + ErrTimeout.Error(); err.Error() != want {
		t.Fatalf("call 1 error %q, want %q", err, want)
	}
	if n >= limit {
		t.Fatalf("call 1 timed out only after the peer had sent all %d late replies and gone silent: each one restarted its timeout", n)
	}
}
