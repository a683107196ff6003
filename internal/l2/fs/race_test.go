package fs_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// consistent fails t unless usage counts key exactly when its file exists.
func consistent(t *testing.T, a *fs.Adapter, key objkey.Key, size int64) {
	t.Helper()
	_, err := os.Stat(a.Path(key))
	onDisk := err == nil
	used := a.Usage().TotalBytesUsed
	if onDisk && used != size || !onDisk && used != 0 {
		t.Fatalf("file on disk: %v, usage %d (object %d bytes): usage does not match the disk", onDisk, used, size)
	}
}

// TestStoreDeleteSameKeyRace interleaves a store and a delete of one key at
// the two points where they used to race, in a synctest bubble so that the
// other call has run as far as it can before the paused one goes on.
// Either order may win, but afterwards usage must count the object exactly
// when its file is on disk.
func TestStoreDeleteSameKeyRace(t *testing.T) {
	// A delete between a store's rename and its accounting removed the
	// file before the store counted it: usage counted a missing file.
	t.Run("DeleteAfterRename", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := newAdapter(t, nil)
			defer a.Close()
			keys := l2test.Keys(t, 1, "")
			objs := l2test.Objects(t, 1)
			reached, release := make(chan struct{}), make(chan struct{})
			fs.SetHooks(a, func(objkey.Key) { close(reached); <-release }, nil)
			stored := make(chan error, 1)
			go func() { stored <- a.Store(context.Background(), keys, objs) }()
			<-reached
			fs.SetHooks(a, nil, nil)
			deleted := make(chan error, 1)
			go func() {
				_, err := a.Delete(context.Background(), keys)
				deleted <- err
			}()
			synctest.Wait() // the delete has finished or waits for the store
			close(release)
			if err := <-stored; err != nil {
				t.Fatal(err)
			}
			if err := <-deleted; err != nil {
				t.Fatal(err)
			}
			consistent(t, a, keys[0], int64(len(objs[0])))
		})
	})
	// A store of a counted key between a delete's remove and its
	// accounting put a new file in place that the delete then forgot:
	// a file on disk outside usage.
	t.Run("StoreAfterRemove", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := newAdapter(t, nil)
			defer a.Close()
			keys := l2test.Keys(t, 1, "")
			objs := l2test.Objects(t, 1)
			if err := a.Store(context.Background(), keys, objs); err != nil {
				t.Fatal(err)
			}
			reached, release := make(chan struct{}), make(chan struct{})
			fs.SetHooks(a, nil, func(objkey.Key) { close(reached); <-release })
			deleted := make(chan error, 1)
			go func() {
				_, err := a.Delete(context.Background(), keys)
				deleted <- err
			}()
			<-reached
			fs.SetHooks(a, nil, nil)
			stored := make(chan error, 1)
			go func() { stored <- a.Store(context.Background(), keys, objs) }()
			synctest.Wait() // the store has finished or waits for the delete
			close(release)
			if err := <-deleted; err != nil {
				t.Fatal(err)
			}
			if err := <-stored; err != nil {
				t.Fatal(err)
			}
			consistent(t, a, keys[0], int64(len(objs[0])))
		})
	})
}

// gatedListener records the last event per key and blocks in the first
// event of its kind (stored or deleted) until release is closed.
type gatedListener struct {
	mu      sync.Mutex
	last    map[objkey.Key]string
	gate    string // "stored" or "deleted"
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func (l *gatedListener) event(kind string, keys []objkey.Key) {
	if kind == l.gate {
		l.once.Do(func() { close(l.reached); <-l.release })
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.last[k] = kind
	}
}

func (l *gatedListener) OnStored(keys []objkey.Key, _ []int64) { l.event("stored", keys) }
func (l *gatedListener) OnAccessed([]objkey.Key)               {}
func (l *gatedListener) OnDeleted(keys []objkey.Key)           { l.event("deleted", keys) }

// TestListenerOrderMatchesDisk: the last event listeners (the eviction
// policy, the coordinator's reporter) hear for a key must match whether
// its object is on disk. Events were fired after the store's or delete's
// marks were cleared, so a delete could remove an object and report it
// before the store that wrote it reported it stored (the policy and the
// coordinator then tracked an object that was gone, and never heard of
// its deletion), or a store could report an object that a delete's late
// report then made them forget (counted, on disk, never evicted).
func TestListenerOrderMatchesDisk(t *testing.T) {
	for _, gate := range []string{"stored", "deleted"} {
		t.Run(gate, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newAdapter(t, nil)
				defer a.Close()
				keys := l2test.Keys(t, 1, "")
				objs := l2test.Objects(t, 1)
				if gate == "deleted" {
					if err := a.Store(context.Background(), keys, objs); err != nil {
						t.Fatal(err)
					}
				}
				l := &gatedListener{last: map[objkey.Key]string{}, gate: gate, reached: make(chan struct{}), release: make(chan struct{})}
				a.AddListener(l)
				store := func(done chan<- error) { done <- a.Store(context.Background(), keys, objs) }
				del := func(done chan<- error) {
					_, err := a.Delete(context.Background(), keys)
					done <- err
				}
				first, second := store, del
				if gate == "deleted" {
					first, second = del, store
				}
				firstDone, secondDone := make(chan error, 1), make(chan error, 1)
				go first(firstDone)
				<-l.reached // the first call is reporting its event
				go second(secondDone)
				synctest.Wait() // the second call has finished or waits for the first
				close(l.release)
				if err := <-firstDone; err != nil {
					t.Fatal(err)
				}
				if err := <-secondDone; err != nil {
					t.Fatal(err)
				}
				_, err := os.Stat(a.Path(keys[0]))
				onDisk := err == nil
				if want := map[bool]string{true: "stored", false: "deleted"}[onDisk]; l.last[keys[0]] != want {
					t.Fatalf("object on disk: %v, but the last event listeners heard was %q", onDisk, l.last[keys[0]])
				}
				consistent(t, a, keys[0], int64(len(objs[0])))
			})
		})
	}
}
