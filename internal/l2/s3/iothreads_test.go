package s3_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// gatedHandler holds every request until release is closed, recording how
// many were in flight at once.
type gatedHandler struct {
	next     http.Handler
	inflight atomic.Int64
	max      atomic.Int64
	limit    int64
	reached  chan struct{}
	once     sync.Once
	release  chan struct{}
	// armed: requests before it (the adapter's start-up) pass untouched.
	armed atomic.Bool
}

func (h *gatedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.armed.Load() {
		h.next.ServeHTTP(w, r)
		return
	}
	n := h.inflight.Add(1)
	for m := h.max.Load(); n > m && !h.max.CompareAndSwap(m, n); m = h.max.Load() {
	}
	if n >= h.limit {
		h.once.Do(func() { close(h.reached) })
	}
	<-h.release
	h.inflight.Add(-1)
	h.next.ServeHTTP(w, r)
}

// TestNumIOThreadsBoundsRequestsInFlight stores 24 keys with
// s3_num_io_threads 3 against a server that holds every request: once three
// are in flight no fourth may arrive, and all 24 land after the release.
func TestNumIOThreadsBoundsRequestsInFlight(t *testing.T) {
	h := &gatedHandler{limit: 3, reached: make(chan struct{}), release: make(chan struct{})}
	srv := s3test.FakeWith(t, func(next http.Handler) http.Handler { h.next = next; return h })
	c := configFor(srv, srv.Bucket)
	c.NumIOThreads = 3
	// Held requests must not count as slow calls: the breaker would open
	// and abort them.
	c.SlowCall = time.Hour
	a := newAdapter(t, c)
	defer a.Close()
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(h.release) }) }
	// Registered after the fake server's cleanup, so it runs first: a
	// failing test must not leave the server waiting on held handlers.
	t.Cleanup(free)
	keys := l2test.Keys(t, 24, "")
	objs := make([][]byte, len(keys))
	for i := range objs {
		objs[i] = []byte{byte(i), 2}
	}
	h.armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- a.Store(context.Background(), keys, objs) }()
	select {
	case <-h.reached:
	case err := <-done:
		t.Fatalf("Store returned %v before 3 requests were in flight (max %d)", err, h.max.Load())
	case <-time.After(60 * time.Second):
		free()
		<-done
		t.Fatalf("3 requests never were in flight at once (max %d)", h.max.Load())
	}
	// A fourth request, were the bound broken, would be on its way now:
	// the store has 24 keys to send and none of the three can finish.
	free()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := h.max.Load(); got != 3 {
		t.Fatalf("at most %d requests in flight, want exactly 3 (s3_num_io_threads)", got)
	}
	if n := len(srv.Keys(t, srv.Bucket)); n != len(keys) {
		t.Fatalf("%d objects stored, want %d", n, len(keys))
	}
}
