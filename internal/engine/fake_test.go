package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// fakeAdapter is an in-memory l2.Adapter with failure injection, used to
// drive the engine's L2 paths deterministically (the fs adapter test uses a
// real one).
type fakeAdapter struct {
	name     string
	failing  atomic.Bool
	capacity int64
	// gate, when set, blocks Load until it is closed or ctx ends; inflight
	// and maxInflight measure concurrent Loads.
	gate                  chan struct{}
	inflight, maxInflight atomic.Int64
	// storeGate, when set, blocks Store until it is closed, ignoring ctx
	// (an adapter stuck in I/O).
	storeGate chan struct{}

	mu        sync.Mutex
	objs      map[objkey.Key][]byte
	locks     map[objkey.Key]int
	loads     map[objkey.Key]int
	stores    int
	listeners []l2.Listener
}

var errInjected = errors.New("injected L2 failure")

func newFake(name string) *fakeAdapter {
	return &fakeAdapter{name: name, objs: map[objkey.Key][]byte{}, locks: map[objkey.Key]int{}, loads: map[objkey.Key]int{}}
}

func (f *fakeAdapter) TypeName() string { return f.name }

func (f *fakeAdapter) Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error {
	if f.storeGate != nil {
		<-f.storeGate
	}
	if f.failing.Load() {
		return errInjected
	}
	f.mu.Lock()
	sizes := make([]int64, len(keys))
	for i, k := range keys {
		f.objs[k] = append([]byte(nil), objs[i]...)
		sizes[i] = int64(len(objs[i]))
	}
	f.stores++
	ls := f.listeners
	f.mu.Unlock()
	for _, l := range ls {
		l.OnStored(keys, sizes)
	}
	return nil
}

func (f *fakeAdapter) put(k objkey.Key, b []byte) {
	f.mu.Lock()
	f.objs[k] = b
	f.mu.Unlock()
}

func (f *fakeAdapter) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	if f.failing.Load() {
		return nil, errInjected
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]bool, len(keys))
	for i, k := range keys {
		if _, ok := f.objs[k]; ok {
			out[i] = true
			f.locks[k]++
		}
	}
	return out, nil
}

func (f *fakeAdapter) Unlock(keys []objkey.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		if f.locks[k]--; f.locks[k] <= 0 {
			delete(f.locks, k)
		}
	}
}

func (f *fakeAdapter) Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error) {
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxInflight.Load()
		if n <= m || f.maxInflight.CompareAndSwap(m, n) {
			break
		}
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]bool, len(keys))
	for i, k := range keys {
		if b, ok := f.objs[k]; ok && len(b) == len(dst[i]) {
			copy(dst[i], b)
			out[i] = true
			f.loads[k]++
		}
	}
	return out, nil
}

func (f *fakeAdapter) Delete(ctx context.Context, keys []objkey.Key) ([]objkey.Key, error) {
	f.mu.Lock()
	var del []objkey.Key
	for _, k := range keys {
		if _, ok := f.objs[k]; ok && f.locks[k] == 0 {
			delete(f.objs, k)
			del = append(del, k)
		}
	}
	ls := f.listeners
	f.mu.Unlock()
	for _, l := range ls {
		l.OnDeleted(del)
	}
	return del, nil
}

func (f *fakeAdapter) List(context.Context, string, int, string) (l2.Page, error) {
	return l2.Page{}, l2.ErrListUnsupported
}

func (f *fakeAdapter) Usage() l2.Usage {
	f.mu.Lock()
	defer f.mu.Unlock()
	u := l2.Usage{TotalCapacityBytes: f.capacity, BytesByCacheSalt: map[string]int64{}}
	for k, b := range f.objs {
		u.TotalBytesUsed += int64(len(b))
		u.BytesByCacheSalt[k.CacheSalt] += int64(len(b))
	}
	return u
}

func (f *fakeAdapter) Status() map[string]any {
	return map[string]any{"is_healthy": true, "type": f.name}
}

func (f *fakeAdapter) AddListener(l l2.Listener) {
	f.mu.Lock()
	f.listeners = append(f.listeners, l)
	f.mu.Unlock()
}

func (f *fakeAdapter) Close() error { return nil }

func (f *fakeAdapter) has(k objkey.Key) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.objs[k]
	return b, ok
}

func (f *fakeAdapter) lockCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.locks)
}

func (f *fakeAdapter) loadCount(k objkey.Key) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads[k]
}

// openFS opens the real fs adapter over dir.
func openFS(dir string) (l2.Adapter, error) {
	return fs.New(fs.Config{BasePath: dir, PersistEnabled: true})
}

func (f *fakeAdapter) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.objs)
}
