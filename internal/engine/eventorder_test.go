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

// panickyListener panics in its first OnL1Stored, as a faulty sink would.
type panickyListener struct{ once sync.Once }

func (l *panickyListener) OnL1Stored([]objkey.Key, []int64) {
	l.once.Do(func() { panic("sink failed") })
}
func (l *panickyListener) OnL1Accessed([]objkey.Key) {}
func (l *panickyListener) OnL1Deleted([]objkey.Key)  {}

// TestEventOrderSurvivesListenerPanic: a listener that panics while it is
// told of a store (the HTTP router and the periodic loops recover such
// panics and go on) does not leave the event order held: a delete and a
// store after it complete. Released without a defer, the order stayed
// held and every later L1 change waited for it forever.
func TestEventOrderSurvivesListenerPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := New(Config{L1SizeBytes: 64 * objSize}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer closeChecked(t, e)
		e.AddL1Listener(&panickyListener{})
		keys := []objkey.Key{mkKey("", 0, 0, 1), mkKey("", 0, 1, 1)}
		func() {
			defer func() {
				if r := recover(); r != "sink failed" {
					t.Fatalf("recovered %v, want the listener's panic", r)
				}
			}()
			_, _ = e.Put(keys[:1], payloads(keys[:1]))
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if n, _ := e.DeleteL1(keys[:1], true); n != 1 {
				t.Errorf("delete after the panic removed %d objects, want 1", n)
			}
			if n, err := e.Put(keys[1:], payloads(keys[1:])); err != nil || n != 1 {
				t.Errorf("store after the panic: %d published, %v; want 1", n, err)
			}
		}()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("L1 changes after a listener's panic are blocked on the event order")
		}
	})
}
