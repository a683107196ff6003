package mq_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestLogLinesDoNotEchoHugePeerInput: what a peer sends reaches the log
// clipped. An unknown op name of 1 MiB, an undecodable op frame of 1 MiB
// (logged in hex) and a LOOKUP whose 1 MiB model_name fails validation
// are each logged (once), in a line of at most 4 KiB that says how long
// the value was, instead of a line of 1 to 2 MiB.
func TestLogLinesDoNotEchoHugePeerInput(t *testing.T) {
	h := start(t, opts{})
	sock := rawDealer(t, h.endpoint)
	huge := strings.Repeat("x", 1<<20)
	// The first request names its op, so the peer is gen3.
	if _, err := sock.SendMessage(wire.EncodeInt(1), msgp.AppendString(nil, huge), wire.Nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sock.SendMessage(wire.EncodeInt(2), append([]byte{0xc1}, huge...)); err != nil {
		t.Fatal(err)
	}
	rawSend(t, sock, 3, wire.OpLookup, wire.Marshal(key("a@"+huge, 1, -1, prompt(80, testChunk), 0, testChunk, "r")), wire.EncodeInt(1))
	rawSend(t, sock, 4, wire.OpNoop)
	// LOOKUP's reply (nil) and NOOP's, in either order: its handler logs
	// before it replies.
	got := map[int64][]byte{}
	for range 2 {
		uid, resp := rawRecv(t, sock)
		got[uid] = resp
	}
	if !bytes.Equal(got[3], wire.Nil) || !bytes.Equal(got[4], wire.OK) {
		t.Fatalf("replies %x, want LOOKUP 3 nil and NOOP 4 ok", got)
	}
	logs := h.logs.String()
	for line := range strings.Lines(logs) {
		if len(line) > 4096 {
			t.Errorf("log line of %d bytes: %.200s...", len(line), line)
		}
	}
	for _, want := range []string{
		"unknown operation; no reply sent", "[1048578 bytes]", // the quoted name
		"undecodable op frame", "[2097154 bytes]", // the frame in hex
		"request failed",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}
