package mq

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestDroppedRepliesAreCounted: a reply the ROUTER cannot deliver (its
// peer is gone: mandatory routing refuses an identity it has no
// connection for) is counted under reason peer_gone, on a real socket.
func TestDroppedRepliesAreCounted(t *testing.T) {
	eng, err := engine.New(engine.Config{L1SizeBytes: 1 << 20, ShmName: "mqdropped", ShmDir: t.TempDir()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	s, err := New(Config{Host: "127.0.0.1"}, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeSockets()
	// Run is not started, so this goroutine owns the sockets.
	for range 3 {
		s.sendRouter([][]byte{[]byte("gone-peer"), wire.EncodeInt(1), wire.EncodeInt(24), wire.OK})
	}
	var m dto.Metric
	if err := s.metrics.ZMQDroppedReplies.WithLabelValues("peer_gone").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 3 {
		t.Fatalf("dropped replies counted %v, want 3", got)
	}
}
