package tracing

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/tracing/otlptest"
)

// TestSpanEndedDuringShutdownCounted: a span that ends while Shutdown is
// flushing (the collector holding the export) is reported to Dropped as
// "shutdown", exactly once; the span queued before Shutdown still arrives.
// Before, the batch processor, already stopped, discarded it uncounted.
func TestSpanEndedDuringShutdownCounted(t *testing.T) {
	rcv := otlptest.Start(t)
	release := rcv.Hold()
	defer release()
	var mu sync.Mutex
	counts := map[string]int{}
	p, err := Start(context.Background(), Config{Enabled: true, Endpoint: "http://" + rcv.Addr,
		Dropped: func(reason string, n int) {
			mu.Lock()
			counts[reason] += n
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	_, queued := Request(context.Background(), "queued")
	End(queued, nil)
	_, late := Request(context.Background(), "late")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Shutdown(ctx) }()
	// Shutdown closes admission and then blocks flushing "queued" to the
	// held collector; wait (bounded) for the first step.
	for deadline := time.Now().Add(10 * time.Second); !p.st.adm.isClosed(); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("Shutdown did not close admission within 10s")
		}
	}
	End(late, nil)
	mu.Lock()
	got := counts["shutdown"]
	mu.Unlock()
	if got != 1 {
		t.Fatalf(`dropped "shutdown" = %d while Shutdown flushes, want 1`, got)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if spans := rcv.Spans(); len(spans) != 1 || spans[0].Name != "queued" {
		t.Fatalf("received %+v, want only the span queued before Shutdown", spans)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(counts) != 1 || counts["shutdown"] != 1 {
		t.Fatalf("dropped = %v, want only shutdown:1", counts)
	}
}

// isClosed reports whether Shutdown has begun turning spans away.
func (a *admission) isClosed() bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.closed
}
