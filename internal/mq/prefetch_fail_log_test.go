package mq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// failingL2 is an fs adapter whose every lookup fails with a plain error
// (not l2.ErrUnavailable, which the engine treats as a known outage): each
// prefetch job that asks it ends with that error.
type failingL2 struct{ l2.Adapter }

func (failingL2) LookupAndLock(_ context.Context, keys []objkey.Key) ([]bool, error) {
	return make([]bool, len(keys)), errors.New("injected lookup failure")
}

// TestPrefetchFailuresLoggedOncePerInterval: while an L2 adapter fails
// every lookup, each LOOKUP's job carries the error; the data path logs it
// once per interval, not once per request (20 LOOKUPs, one line), and
// every LOOKUP is still answered (0 hits).
func TestPrefetchFailuresLoggedOncePerInterval(t *testing.T) {
	inner, err := fs.New(fs.Config{BasePath: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inner.Close() })
	h := start(t, opts{l2: []l2.Adapter{failingL2{inner}}})
	if err := h.eng.RegisterLayout(engine.Layout{ModelName: "m", WorldSize: 1, ObjectBytes: testObj}); err != nil {
		t.Fatal(err)
	}
	sched := h.dial(mqclient.Options{})
	const lookups = 20
	for i := range lookups {
		if n := lookupOnce(t, sched, key("m", 1, -1, prompt(70+i, testChunk), 0, testChunk, fmt.Sprint("f", i))); n != 0 {
			t.Fatalf("LOOKUP %d hit %d chunks, want 0", i, n)
		}
	}
	logs := h.logs.String()
	if n := strings.Count(logs, "msg=\"prefetch job failed"); n != 1 {
		t.Errorf("%d log lines for %d failed prefetch jobs, want 1", n, lookups)
	}
}
