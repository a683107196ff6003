package engine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// cutProxy forwards TCP connections to a real server until cut: then every
// open connection is closed and new ones are closed on accept, which is how
// an S3 outage looks from the client. Its goroutines are owned by the proxy
// and end in close.
type cutProxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down.Load() || p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.pipe(c) })
	}
}

func (p *cutProxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(up) {
		if up != nil {
			_ = up.Close()
		}
		_ = c.Close()
		return
	}
	var wg sync.WaitGroup
	for _, pair := range [][2]net.Conn{{up, c}, {c, up}} {
		wg.Go(func() {
			_, _ = io.Copy(pair[0], pair[1])
			_ = pair[0].Close()
			_ = pair[1].Close()
		})
	}
	wg.Wait()
}

// setDown cuts (true) or restores (false) the link.
func (p *cutProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down.Store(down)
	if down {
		for c := range p.conns {
			_ = c.Close()
		}
		clear(p.conns)
	}
}

func (p *cutProxy) close() {
	_ = p.ln.Close()
	p.setDown(true)
	p.mu.Lock()
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// TestWriteBehindS3Outage is the S3 fault proof on a real server
// (versitygw): while S3 is unreachable stores still succeed into L1, every
// object stays resident and pinned even above the eviction watermark, and
// nothing reaches the bucket; once S3 is back every pending upload lands
// under its upstream name, byte-identical, and an L1 clear followed by a
// lookup reads them back from S3.
func TestWriteBehindS3Outage(t *testing.T) {
	srv := s3test.Versity(t)
	proxy := newCutProxy(t, srv.Endpoint)
	cfg := s3.Defaults()
	cfg.Endpoint, cfg.Region, cfg.DisableTLS = proxy.addr(), s3test.Region, true
	cfg.AddressingStyle, cfg.Bucket = "path", srv.Bucket
	cfg.AccessKeyID, cfg.SecretAccessKey = srv.AccessKey, srv.SecretKey
	cfg.MaxAttempts, cfg.BreakerCooldown, cfg.OpTimeout = 1, 50*time.Millisecond, 5*time.Second
	a, err := s3.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	proxy.setDown(true)
	h := start(t, Config{EvictionInterval: 5 * time.Millisecond, StoreMaxAttempts: 1000, StoreRetryBase: 5 * time.Millisecond, StoreRetryMax: 50 * time.Millisecond}, a)
	defer h.stop(t)
	cs := chunks("tenant", 0, 30, 2)
	keys := flat(cs) // 60 of 64 slots: above the watermark
	if n, err := h.Put(keys, payloads(keys)); err != nil || n != len(keys) {
		t.Fatalf("store during the outage: %d stored, %v", n, err)
	}
	waitFor(t, func() bool { return h.Counters().L2[0].StoreFailed >= 5 })
	c := h.Counters()
	if c.L1Objects != 60 || c.L1PendingUpload != 60 || c.L1Evicted["tenant"] != 0 || c.L1EvictionLoopTicks == 0 {
		t.Fatalf("L1 lost objects with pending uploads: %+v", c)
	}
	if st := a.Status(); st["connection_disabled"] != true {
		t.Fatalf("S3 status during the outage: %v", st)
	}
	if names := srv.Keys(t, srv.Bucket); len(names) != 0 {
		t.Fatalf("%d objects reached S3 during the outage", len(names))
	}

	proxy.setDown(false)
	waitFor(t, func() bool { return h.Counters().L2[0].StoreObjects == 60 })
	if c := h.Counters(); c.L2[0].StoreAbandoned != 0 || c.L2[0].PendingStores != 0 || c.L2[0].StoreRetried == 0 {
		t.Fatalf("after recovery: %+v", c.L2[0])
	}
	for _, k := range keys {
		out, err := srv.Client.GetObject(context.Background(), &awss3.GetObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String(k.S3Name())})
		if err != nil {
			t.Fatalf("object %s after recovery: %v", k.S3Name(), err)
		}
		b, err := io.ReadAll(out.Body)
		out.Body.Close()
		if err != nil || !bytes.Equal(b, pattern(k, objSize)) {
			t.Fatalf("object %s differs after recovery (%v)", k.S3Name(), err)
		}
	}

	h.Clear()
	r := h.lookup(t, "back", cs)
	if r.PrefixChunks != 30 || r.L2Keys != 60 || r.Err != nil {
		t.Fatalf("lookup from S3 after clear: %+v", r)
	}
	h.mustReadBack(t, keys)
	h.ReleaseRead("back", keys, 1)
	if _, err := h.PollPrefetch("back"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("consumed job polled again: %v", err)
	}
}
