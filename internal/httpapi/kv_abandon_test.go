package httpapi_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// stallAdapter is an fs adapter whose LookupAndLock waits until the test
// releases it (or its context ends), so a lookup's L2 phase is still
// running when its HTTP client goes away.
type stallAdapter struct {
	*fs.Adapter
	entered, release chan struct{}
	enterOnce        sync.Once
}

func (*stallAdapter) TypeName() string { return "stall" }

func (a *stallAdapter) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	a.enterOnce.Do(func() { close(a.entered) })
	select {
	case <-a.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return a.Adapter.LookupAndLock(ctx, keys)
}

// TestKVLookupClientGoneReleasesLocks: a /api/kv lookup whose client goes
// away while the L2 phase still runs releases the read locks its job took
// (the L1 hit taken at once, the prefix when the job ends). The handler
// used to return on the cancelled wait with nothing left to release them,
// so every abandoned lookup pinned its L1 prefix until the read lease
// expired (300 s by default): not evictable, not deletable without force.
func TestKVLookupClientGoneReleasesLocks(t *testing.T) {
	inner, _ := newFS(t)
	stall := &stallAdapter{Adapter: inner, entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	releaseStall := func() { releaseOnce.Do(func() { close(stall.release) }) }
	var logs logtest.Buffer
	e := start(t, envOpts{extraAdapt: []l2.Adapter{stall}, mutate: func(o *httpapi.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}})
	// Runs before the harness's cleanup (LIFO), so a failing test does not
	// leave the job stalled.
	t.Cleanup(releaseStall)

	// Chunk 0 is in L1; chunk 1 is nowhere, so the lookup locks chunk 0
	// at once and then asks the adapters about chunk 1.
	e.store(tokens(0, testChunk), "", payload(1, 3))
	drainWriteBehind(t, e.eng)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", e.base+"/api/kv/lookup", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(httpapi.HeaderModel, testModel)
	req.Header.Set(httpapi.HeaderTokens, tokens(0, 2*testChunk))
	done := make(chan error, 1)
	go func() {
		res, err := e.hc.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	select {
	case <-stall.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the lookup never reached the L2 phase")
	}
	if leaks := e.eng.Leaks(); len(leaks) == 0 {
		t.Fatal("the lookup holds no lock on its L1 hit while the L2 phase runs")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("client: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled request did not return")
	}
	// The server has seen the client go (the handler logged its end)
	// before the job can finish.
	waitFor(t, "the handler to end", func() bool { return logs.Has("path=/api/kv/lookup") })
	releaseStall()
	waitFor(t, "the abandoned lookup's locks to be released", func() bool { return len(e.eng.Leaks()) == 0 })
	// A client that stopped waiting is no server failure: no ERROR line.
	if out := logs.String(); strings.Contains(out, "level=ERROR") {
		t.Errorf("an abandoned lookup logged an ERROR:\n%s", out)
	}
}
