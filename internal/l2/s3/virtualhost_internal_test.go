package s3

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// TestVirtualHostedVersity sends virtual-hosted requests to a real S3
// server: versitygw with virtual-host addressing under s3.lmcache.test,
// and adapters configured as a user would for that style (the default
// s3_addressing_style, an endpoint of the form <bucket>.<host>:<port>, no
// s3_bucket). Only name resolution is stood in for, because nothing maps
// <bucket>.s3.lmcache.test to 127.0.0.1: the adapter's dialer connects to
// versitygw's address and records the address it was asked for. The
// conformance suite passes that way; every connection was for a bucket's
// own host name, never the bare domain; and an object stored through such
// an adapter is in the bucket its host name named, as the path-style
// client reads it.
func TestVirtualHostedVersity(t *testing.T) {
	const domain = "s3.lmcache.test"
	srv := s3test.VersityVirtualHosted(t, domain)
	_, port, err := net.SplitHostPort(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	dialed := map[string]int{}
	open := func(t *testing.T, bucket string) *Adapter {
		t.Helper()
		c := Defaults()
		c.Endpoint = bucket + "." + domain + ":" + port
		c.Region = s3test.Region
		c.DisableTLS = true
		c.AccessKeyID, c.SecretAccessKey = srv.AccessKey, srv.SecretKey
		a, err := New(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if a.tgt.pathStyle || a.tgt.bucket != bucket || a.tgt.baseURL != "http://"+domain+":"+port {
			t.Fatalf("target = %+v, want virtual-hosted bucket %s at http://%s:%s", a.tgt, bucket, domain, port)
		}
		a.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialed[addr]++
			mu.Unlock()
			return (&net.Dialer{}).DialContext(ctx, network, srv.Endpoint)
		}
		return a
	}
	buckets := []string{srv.Bucket}
	l2test.Run(t, func(t *testing.T) l2.Adapter {
		b := srv.NewBucket(t)
		mu.Lock()
		buckets = append(buckets, b)
		mu.Unlock()
		return open(t, b)
	})

	a := open(t, srv.Bucket)
	defer a.Close()
	key, err := objkey.New([]byte{0x9f, 0x2c}, "Qwen/Qwen3-8B", objkey.RankFor(1, 0), 0, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Store(context.Background(), []objkey.Key{key}, [][]byte{[]byte("virtual")}); err != nil {
		t.Fatal(err)
	}
	if names, want := srv.Keys(t, srv.Bucket), []string{"Qwen/Qwen3-8B@01000100@0@9f2c@alice"}; !slices.Equal(names, want) {
		t.Fatalf("objects in %s = %q, want %q", srv.Bucket, names, want)
	}

	mu.Lock()
	defer mu.Unlock()
	// Every bucket's host name but that of the suite's closed adapter,
	// which sends nothing.
	if len(dialed) != len(buckets)-1 || dialed[srv.Bucket+"."+domain+":"+port] == 0 {
		t.Fatalf("connections for %d host names, want %d (one per bucket, %s's among them): %v", len(dialed), len(buckets)-1, srv.Bucket, dialed)
	}
	for addr := range dialed {
		b, ok := strings.CutSuffix(addr, "."+domain+":"+port)
		if !ok || !slices.Contains(buckets, b) {
			t.Errorf("a connection for %q, not for a bucket's virtual host", addr)
		}
	}
}
