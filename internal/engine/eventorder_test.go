package engine

import (
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// gatedListener records L1 events in the order it receives them; its
// first OnL1Stored waits for gate, as a slow sink would.
type gatedListener struct {
	entered, gate chan struct{}
	once          sync.Once
	mu            sync.Mutex
	log           []string
}

func (l *gatedListener) record(ev string, keys []objkey.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.log = append(l.log, ev+" "+k.ChunkHash)
	}
}

func (l *gatedListener) OnL1Stored(keys []objkey.Key, _ []int64) {
	l.once.Do(func() {
		close(l.entered)
		<-l.gate
	})
	l.record("stored", keys)
}
func (l *gatedListener) OnL1Accessed([]objkey.Key)     {}
func (l *gatedListener) OnL1Deleted(keys []objkey.Key) { l.record("deleted", keys) }

// TestL1EventsInTableOrder: listeners (the KV event log routers follow)
// hear of L1 changes in the order the table made them. A Clear that
// removed a just-committed key while the store was still reporting it
// used to report the removal first, so the last event a router saw said
// stored for a key L1 no longer held.
func TestL1EventsInTableOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := New(Config{L1SizeBytes: 64 * objSize}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer closeChecked(t, e)
		l := &gatedListener{entered: make(chan struct{}), gate: make(chan struct{})}
		e.AddL1Listener(l)
		keys := []objkey.Key{mkKey("", 0, 0, 1)}
		putDone := make(chan error, 1)
		go func() {
			_, err := e.Put(keys, payloads(keys))
			putDone <- err
		}()
		<-l.entered // committed; the store's report is under way
		clearDone := make(chan ClearResult, 1)
		go func() { clearDone <- e.Clear() }()
		synctest.Wait() // the Clear has finished, or waits for the report to end
		close(l.gate)
		if err := <-putDone; err != nil {
			t.Fatal(err)
		}
		if r := <-clearDone; r.Objects != 1 {
			t.Fatalf("clear removed %d objects, want 1", r.Objects)
		}
		want := []string{"stored chunk-000000", "deleted chunk-000000"}
		l.mu.Lock()
		defer l.mu.Unlock()
		if !slices.Equal(l.log, want) {
			t.Fatalf("events %q, want %q (the key is gone from L1)", l.log, want)
		}
	})
}
