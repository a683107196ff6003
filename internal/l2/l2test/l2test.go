// Package l2test is the conformance test body every L2 adapter passes:
// l2test.Run(t, newAdapter). Each subtest opens a fresh adapter and uses its
// own random model name, so adapters that share one bucket or directory
// across subtests still see only their own keys.
package l2test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// MaxObjectBytes is the largest object the suite stores; fixed-slot adapters
// (DAX) must be configured with slots at least this big.
const MaxObjectBytes = 4096

// Run runs the conformance suite. newAdapter must return a ready adapter;
// Run closes it.
func Run(t *testing.T, newAdapter func(t *testing.T) l2.Adapter) {
	t.Run("StoreLookupLoad", func(t *testing.T) { testStoreLookupLoad(t, open(t, newAdapter)) })
	t.Run("Misses", func(t *testing.T) { testMisses(t, open(t, newAdapter)) })
	t.Run("RestoreIsIdempotent", func(t *testing.T) { testRestore(t, open(t, newAdapter)) })
	t.Run("DeleteSkipsLockedAndNotifies", func(t *testing.T) { testDelete(t, open(t, newAdapter)) })
	t.Run("ListPages", func(t *testing.T) { testList(t, open(t, newAdapter)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, open(t, newAdapter)) })
	t.Run("StoreDeleteSameKeys", func(t *testing.T) { testStoreDeleteSameKeys(t, open(t, newAdapter)) })
	t.Run("ClosedIsUnavailable", func(t *testing.T) { testClosed(t, newAdapter(t)) })
}

func open(t *testing.T, newAdapter func(t *testing.T) l2.Adapter) l2.Adapter {
	a := newAdapter(t)
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return a
}

// Keys returns n random keys of one fresh model (with a slash, as real
// model names have) and the given salt.
func Keys(t testing.TB, n int, salt string) []objkey.Key {
	t.Helper()
	model := "conf/m-" + randHex(t, 6)
	return KeysFor(t, model, n, salt)
}

// KeysFor returns n random keys for model.
func KeysFor(t testing.TB, model string, n int, salt string) []objkey.Key {
	t.Helper()
	keys := make([]objkey.Key, n)
	for i := range keys {
		h := make([]byte, 32)
		_, _ = rand.Read(h)
		k, err := objkey.New(h, model, objkey.RankFor(2, i%2), int64(i%3), salt)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	return keys
}

// Objects returns one random payload per key with distinct sizes <=
// MaxObjectBytes.
func Objects(t testing.TB, n int) [][]byte {
	objs := make([][]byte, n)
	for i := range objs {
		objs[i] = make([]byte, MaxObjectBytes-(i*97)%MaxObjectBytes/2)
		_, _ = rand.Read(objs[i])
	}
	return objs
}

func randHex(t testing.TB, n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// Recorder is a Listener that records every event.
type Recorder struct {
	mu       sync.Mutex
	Stored   map[objkey.Key]int64
	Accessed []objkey.Key
	Deleted  []objkey.Key
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{Stored: map[objkey.Key]int64{}} }

// OnStored implements l2.Listener.
func (r *Recorder) OnStored(keys []objkey.Key, sizes []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, k := range keys {
		r.Stored[k] = sizes[i]
	}
}

// OnAccessed implements l2.Listener.
func (r *Recorder) OnAccessed(keys []objkey.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Accessed = append(r.Accessed, keys...)
}

// OnDeleted implements l2.Listener.
func (r *Recorder) OnDeleted(keys []objkey.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Deleted = append(r.Deleted, keys...)
}

// DeletedKeys returns a sorted copy of the deleted keys.
func (r *Recorder) DeletedKeys() []objkey.Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sortKeys(slices.Clone(r.Deleted))
}

func sortKeys(ks []objkey.Key) []objkey.Key {
	sort.Slice(ks, func(i, j int) bool { return ks[i].S3Name() < ks[j].S3Name() })
	return ks
}

func allTrue(n int) []bool {
	b := make([]bool, n)
	for i := range b {
		b[i] = true
	}
	return b
}

// LoadAll loads keys into buffers sized like want and checks the bytes.
func LoadAll(t testing.TB, a l2.Adapter, keys []objkey.Key, want [][]byte) {
	t.Helper()
	ctx := context.Background()
	dst := make([][]byte, len(want))
	for i := range dst {
		dst[i] = make([]byte, len(want[i]))
	}
	ok, err := a.Load(ctx, keys, dst)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if !slices.Equal(ok, allTrue(len(keys))) {
		t.Fatalf("Load bitmap = %v, want all true", ok)
	}
	for i := range dst {
		if !bytes.Equal(dst[i], want[i]) {
			t.Fatalf("Load key %d: bytes differ", i)
		}
	}
}

func testStoreLookupLoad(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	rec := NewRecorder()
	a.AddListener(rec)
	before := a.Usage()
	plain := Keys(t, 4, "")
	salted := KeysFor(t, plain[0].ModelName, 3, "user-a")
	keys := append(slices.Clone(plain), salted...)
	objs := Objects(t, len(keys))
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatalf("Store: %v", err)
	}
	var sum, saltSum int64
	for i, k := range keys {
		sum += int64(len(objs[i]))
		if k.CacheSalt == "user-a" {
			saltSum += int64(len(objs[i]))
		}
		if got, ok := rec.Stored[k]; !ok || got != int64(len(objs[i])) {
			t.Errorf("OnStored size for key %d = %d (seen %v), want %d", i, got, ok, len(objs[i]))
		}
	}
	after := a.Usage()
	// Fixed-slot adapters account a whole slot per object, so usage grows
	// by at least the payload bytes.
	if grow := after.TotalBytesUsed - before.TotalBytesUsed; grow < sum {
		t.Errorf("usage grew by %d, want >= %d", grow, sum)
	}
	if got := after.BytesByCacheSalt["user-a"] - before.BytesByCacheSalt["user-a"]; got < saltSum {
		t.Errorf("usage of salt user-a grew by %d, want >= %d", got, saltSum)
	}
	hits, err := a.LookupAndLock(ctx, keys)
	if err != nil {
		t.Fatalf("LookupAndLock: %v", err)
	}
	if !slices.Equal(hits, allTrue(len(keys))) {
		t.Fatalf("LookupAndLock = %v, want all true", hits)
	}
	if len(rec.Accessed) != len(keys) {
		t.Errorf("OnAccessed saw %d keys, want %d", len(rec.Accessed), len(keys))
	}
	LoadAll(t, a, keys, objs)
	a.Unlock(keys)
	a.Unlock(keys) // extra unlocks are harmless
	if st := a.Status(); st == nil {
		t.Error("Status returned nil")
	}
	if a.TypeName() == "" {
		t.Error("empty TypeName")
	}
}

func testMisses(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	stored := Keys(t, 2, "")
	objs := Objects(t, 2)
	if err := a.Store(ctx, stored, objs); err != nil {
		t.Fatal(err)
	}
	missing := KeysFor(t, stored[0].ModelName, 2, "")
	// A salted twin of a stored key is a different object.
	twin := stored[0]
	twin.CacheSalt = "other"
	mixed := []objkey.Key{missing[0], stored[0], twin, stored[1], missing[1]}
	hits, err := a.LookupAndLock(ctx, mixed)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{false, true, false, true, false}; !slices.Equal(hits, want) {
		t.Fatalf("LookupAndLock = %v, want %v", hits, want)
	}
	defer a.Unlock([]objkey.Key{stored[0], stored[1]})
	dst := [][]byte{make([]byte, 10), make([]byte, len(objs[0])), make([]byte, 10)}
	ok, err := a.Load(ctx, []objkey.Key{missing[0], stored[0], missing[1]}, dst)
	if err != nil {
		t.Fatalf("Load with misses: %v", err)
	}
	if want := []bool{false, true, false}; !slices.Equal(ok, want) {
		t.Fatalf("Load = %v, want %v", ok, want)
	}
	if !bytes.Equal(dst[1], objs[0]) {
		t.Fatal("loaded bytes differ")
	}
	// Empty calls are fine.
	if err := a.Store(ctx, nil, nil); err != nil {
		t.Fatalf("empty Store: %v", err)
	}
	if h, err := a.LookupAndLock(ctx, nil); err != nil || len(h) != 0 {
		t.Fatalf("empty lookup: %v %v", h, err)
	}
}

func testRestore(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	keys := Keys(t, 3, "salt-r")
	objs := Objects(t, 3)
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	u1 := a.Usage()
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	if u2 := a.Usage(); u2.TotalBytesUsed != u1.TotalBytesUsed || u2.BytesByCacheSalt["salt-r"] != u1.BytesByCacheSalt["salt-r"] {
		t.Fatalf("re-store changed usage: %+v -> %+v", u1, u2)
	}
	LoadAll(t, a, keys, objs)
}

func testDelete(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	rec := NewRecorder()
	a.AddListener(rec)
	before := a.Usage().TotalBytesUsed
	keys := Keys(t, 4, "")
	objs := Objects(t, 4)
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	hits, err := a.LookupAndLock(ctx, keys[:1])
	if err != nil || !hits[0] {
		t.Fatalf("lock: %v %v", hits, err)
	}
	deleted, err := a.Delete(ctx, keys)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if want := sortKeys(slices.Clone(keys[1:])); !slices.Equal(sortKeys(deleted), want) {
		t.Fatalf("Delete returned %d keys, want the 3 unlocked ones", len(deleted))
	}
	if got, want := rec.DeletedKeys(), sortKeys(slices.Clone(keys[1:])); !slices.Equal(got, want) {
		t.Fatalf("OnDeleted got %d keys, want %d", len(got), len(want))
	}
	hits, err = a.LookupAndLock(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, false, false}; !slices.Equal(hits, want) {
		t.Fatalf("after delete LookupAndLock = %v, want %v", hits, want)
	}
	LoadAll(t, a, keys[:1], objs[:1])
	a.Unlock(keys[:1])
	a.Unlock(keys[:1])
	deleted, err = a.Delete(ctx, keys[:1])
	if err != nil || len(deleted) != 1 || deleted[0] != keys[0] {
		t.Fatalf("delete after unlock = %v, %v", deleted, err)
	}
	if got := a.Usage().TotalBytesUsed; got != before {
		t.Fatalf("usage after deleting everything = %d, want %d", got, before)
	}
	if hits, _ := a.LookupAndLock(ctx, keys[:1]); hits[0] {
		t.Fatal("deleted key still found")
	}
}

func testList(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	keys := Keys(t, 5, "")
	keys = append(keys, KeysFor(t, keys[0].ModelName, 2, "user-b")...)
	other := Keys(t, 2, "")
	objs := Objects(t, len(keys)+len(other))
	if err := a.Store(ctx, append(slices.Clone(keys), other...), objs); err != nil {
		t.Fatal(err)
	}
	// Every adapter here lists (upstream's fs and dax cannot; see
	// docs/compatibility.md, L2 adapters), so l2.ErrListUnsupported is a failure too.
	got := map[objkey.Key]int64{}
	token, pages := "", 0
	for {
		p, err := a.List(ctx, keys[0].ModelName, 2, token)
		if err != nil {
			t.Fatalf("List page %d: %v", pages, err)
		}
		if len(p.Entries) > 2 {
			t.Fatalf("page of %d entries with page size 2", len(p.Entries))
		}
		for _, e := range p.Entries {
			if _, dup := got[e.Key]; dup {
				t.Fatalf("key listed twice: %v", e.Key)
			}
			got[e.Key] = e.SizeBytes
		}
		pages++
		if p.NextPageToken == "" {
			break
		}
		if pages > 20 {
			t.Fatal("listing does not end")
		}
		token = p.NextPageToken
	}
	if pages < 4 {
		t.Errorf("7 keys in pages of 2 took %d pages", pages)
	}
	if len(got) != len(keys) {
		t.Fatalf("listed %d keys for the model, want %d", len(got), len(keys))
	}
	for i, k := range keys {
		if sz, ok := got[k]; !ok || sz != int64(len(objs[i])) {
			t.Errorf("key %d listed=%v size=%d want %d", i, ok, sz, len(objs[i]))
		}
	}
	// Unfiltered listing includes the other model too.
	all := map[objkey.Key]bool{}
	token = ""
	for i := 0; i < 1000; i++ {
		p, err := a.List(ctx, "", 1000, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Entries {
			all[e.Key] = true
		}
		if token = p.NextPageToken; token == "" {
			break
		}
	}
	for _, k := range append(slices.Clone(keys), other...) {
		if !all[k] {
			t.Errorf("unfiltered listing misses %v", k)
		}
	}
}

func testConcurrent(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	const workers, per = 6, 3
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	model := "conf/c-" + randHex(t, 6)
	for w := 0; w < workers; w++ {
		keys := KeysFor(t, model, per, fmt.Sprintf("s%d", w%2))
		objs := Objects(t, per)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Store(ctx, keys, objs); err != nil {
				errs <- err
				return
			}
			hits, err := a.LookupAndLock(ctx, keys)
			if err != nil || !slices.Equal(hits, allTrue(per)) {
				errs <- fmt.Errorf("lookup %v %v", hits, err)
				return
			}
			defer a.Unlock(keys)
			dst := make([][]byte, per)
			for i := range dst {
				dst[i] = make([]byte, len(objs[i]))
			}
			ok, err := a.Load(ctx, keys, dst)
			if err != nil || !slices.Equal(ok, allTrue(per)) {
				errs <- fmt.Errorf("load %v %v", ok, err)
				return
			}
			for i := range dst {
				if !bytes.Equal(dst[i], objs[i]) {
					errs <- errors.New("bytes differ")
					return
				}
			}
			_ = a.Usage()
			_ = a.Status()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// LastEvents is a Listener that keeps the last stored or deleted event of
// each key: after any race between stores, deletes and reconfigurations,
// a key an adapter holds must have "stored" last and one it lost
// "deleted".
type LastEvents struct {
	mu   sync.Mutex
	last map[objkey.Key]string
}

// NewLastEvents returns a LastEvents that has heard nothing.
func NewLastEvents() *LastEvents { return &LastEvents{last: map[objkey.Key]string{}} }

func (l *LastEvents) set(kind string, keys []objkey.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.last[k] = kind
	}
}

// Of is the last event heard for k: "stored", "deleted", or "" for none.
func (l *LastEvents) Of(k objkey.Key) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last[k]
}

// OnStored implements l2.Listener.
func (l *LastEvents) OnStored(keys []objkey.Key, _ []int64) { l.set("stored", keys) }

// OnAccessed implements l2.Listener.
func (l *LastEvents) OnAccessed([]objkey.Key) {}

// OnDeleted implements l2.Listener.
func (l *LastEvents) OnDeleted(keys []objkey.Key) { l.set("deleted", keys) }

// testStoreDeleteSameKeys runs stores and deletes of the same keys at once.
// Whichever wins each race, afterwards a key is found exactly when the last
// event listeners heard for it was a store (the eviction policy and the
// coordinator track what the adapter holds), and deleting everything
// brings usage back to where it started.
func testStoreDeleteSameKeys(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	before := a.Usage()
	l := NewLastEvents()
	a.AddListener(l)
	keys := Keys(t, 4, "race")
	objs := Objects(t, 4)
	const workers, rounds = 4, 8
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for w := range workers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := a.Store(ctx, keys, objs); err != nil {
					errs <- fmt.Errorf("store %d: %w", w, err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range rounds {
				if _, err := a.Delete(ctx, keys); err != nil {
					errs <- fmt.Errorf("delete %d: %w", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	hits, err := a.LookupAndLock(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	a.Unlock(keys)
	for i, k := range keys {
		if got := l.Of(k); hits[i] != (got == "stored") {
			t.Errorf("key %d found: %v, but the last event listeners heard was %q", i, hits[i], got)
		}
	}
	if _, err := a.Delete(ctx, keys); err != nil {
		t.Fatal(err)
	}
	after := a.Usage()
	if after.TotalBytesUsed != before.TotalBytesUsed || after.BytesByCacheSalt["race"] != before.BytesByCacheSalt["race"] {
		t.Fatalf("usage after deleting everything = %+v, want %+v", after, before)
	}
	if hits, _ := a.LookupAndLock(ctx, keys); slices.Contains(hits, true) {
		a.Unlock(keys)
		t.Fatalf("keys found after deleting everything: %v", hits)
	}
}

func testClosed(t *testing.T, a l2.Adapter) {
	ctx := context.Background()
	keys := Keys(t, 1, "")
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Store(ctx, keys, Objects(t, 1)); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("Store after Close = %v, want ErrUnavailable", err)
	}
	if _, err := a.LookupAndLock(ctx, keys); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("LookupAndLock after Close = %v, want ErrUnavailable", err)
	}
	if _, err := a.Load(ctx, keys, [][]byte{make([]byte, 4)}); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("Load after Close = %v, want ErrUnavailable", err)
	}
	a.Unlock(keys)
}

// OpenJSON opens the adapter one --l2-adapter value describes, as the
// server does (ParseSpec, then Open), failing tb on either error; the
// adapter is closed when the test ends.
func OpenJSON(tb testing.TB, js string) l2.Adapter {
	tb.Helper()
	spec, err := l2.ParseSpec(1, []byte(js))
	if err != nil {
		tb.Fatal(err)
	}
	a, err := l2.Open(context.Background(), spec)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = a.Close() })
	return a
}
