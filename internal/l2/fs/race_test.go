package fs_test

import (
	"context"
	"os"
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
