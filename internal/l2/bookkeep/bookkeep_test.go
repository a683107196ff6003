package bookkeep_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/bookkeep"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// tryLock locks k alone and reports whether it was locked.
func tryLock(b *bookkeep.Book, k objkey.Key) bool {
	hits := []bool{true}
	b.LockHits([]objkey.Key{k}, hits)
	return hits[0]
}

type accessRec struct{ accessed []objkey.Key }

func (r *accessRec) OnStored([]objkey.Key, []int64) {}
func (r *accessRec) OnAccessed(ks []objkey.Key)     { r.accessed = append(r.accessed, ks...) }
func (r *accessRec) OnDeleted([]objkey.Key)         {}

func key(t *testing.T, b byte, salt string) objkey.Key {
	k, err := objkey.New([]byte{b}, "m", 0, 0, salt)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestLocksAndDeletes(t *testing.T) {
	b := bookkeep.New(100)
	k1, k2, k3 := key(t, 1, ""), key(t, 2, "s"), key(t, 3, "")
	b.Stored([]objkey.Key{k1, k2, k3}, []int64{10, 20, 30})
	b.Stored([]objkey.Key{k1}, []int64{10}) // known: not counted twice
	for range 2 {
		if !tryLock(b, k1) {
			t.Fatal("TryLock")
		}
	}
	victims := b.BeginDelete([]objkey.Key{k1, k2, k2, k3})
	if !slices.Equal(victims, []objkey.Key{k2, k3}) {
		t.Fatalf("victims = %v", victims)
	}
	if tryLock(b, k2) {
		t.Fatal("locked a key being deleted")
	}
	if again := b.BeginDelete([]objkey.Key{k2}); len(again) != 0 {
		t.Fatal("key deleted twice concurrently")
	}
	b.EndDelete(victims, []objkey.Key{k2}) // k3's removal failed
	u := b.Usage()
	if u.TotalBytesUsed != 40 || u.TotalCapacityBytes != 100 || u.BytesByCacheSalt["s"] != 0 || len(u.BytesByCacheSalt) != 1 {
		t.Fatalf("usage = %+v", u)
	}
	if !tryLock(b, k3) {
		t.Fatal("k3 stays lockable after a failed delete")
	}
	b.Unlock([]objkey.Key{k1, k3, k3})
	if b.LockCount(k1) != 1 || b.LockCount(k3) != 0 || b.LockedKeys() != 1 {
		t.Fatalf("locks: k1=%d k3=%d", b.LockCount(k1), b.LockCount(k3))
	}
	if u := b.Usage(); u.Fraction() != 0.4 {
		t.Fatalf("fraction %v", u.Fraction())
	}
}

// TestLockHits: only hits are locked, a key being deleted turns into a
// miss, and listeners hear of exactly the keys locked.
func TestLockHits(t *testing.T) {
	b := bookkeep.New(0)
	rec := &accessRec{}
	b.AddListener(rec)
	k1, k2, k3 := key(t, 1, ""), key(t, 2, ""), key(t, 3, "")
	b.BeginDelete([]objkey.Key{k3})
	hits := []bool{true, false, true}
	b.LockHits([]objkey.Key{k1, k2, k3}, hits)
	if !slices.Equal(hits, []bool{true, false, false}) {
		t.Fatalf("hits = %v", hits)
	}
	if b.LockCount(k1) != 1 || b.LockCount(k2) != 0 || b.LockCount(k3) != 0 {
		t.Fatalf("locks k1=%d k2=%d k3=%d", b.LockCount(k1), b.LockCount(k2), b.LockCount(k3))
	}
	if !slices.Equal(rec.accessed, []objkey.Key{k1}) {
		t.Fatalf("OnAccessed got %v", rec.accessed)
	}
}

// TestGate: Close waits for a call in flight (in a synctest bubble, so
// "Close has not run fn" is checked when nothing else can happen), calls
// arriving meanwhile are refused, a second Close waits for the first and
// returns nil, and fn runs once.
func TestGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g bookkeep.Gate
		if err := g.Enter("x"); err != nil {
			t.Fatal(err)
		}
		var ran atomic.Int32
		closed := make(chan error, 1)
		go func() { closed <- g.Close(func() error { ran.Add(1); return errors.New("boom") }) }()
		synctest.Wait() // Close is now blocked for good unless the call leaves
		if ran.Load() != 0 {
			t.Fatal("Close ran fn while a call was in flight")
		}
		if !g.Closed() {
			t.Fatal("Closed = false while Close waits")
		}
		if err := g.Enter("x"); !errors.Is(err, l2.ErrUnavailable) || err.Error() != "x: adapter unavailable: closed" {
			t.Fatalf("Enter while Close waits = %v", err)
		}
		second := make(chan error, 1)
		go func() { second <- g.Close(func() error { ran.Add(1); return nil }) }()
		synctest.Wait()
		select {
		case err := <-second:
			t.Fatalf("second Close returned %v before the first finished", err)
		default:
		}
		g.Leave()
		if err := <-closed; err == nil || err.Error() != "boom" || ran.Load() != 1 {
			t.Fatalf("Close = %v, ran %d", err, ran.Load())
		}
		if err := <-second; err != nil || ran.Load() != 1 {
			t.Fatalf("second Close = %v, ran %d", err, ran.Load())
		}
		if err := g.Close(func() error { ran.Add(1); return nil }); err != nil || ran.Load() != 1 {
			t.Fatalf("third Close = %v, ran %d", err, ran.Load())
		}
		if err := g.Enter("x"); !errors.Is(err, l2.ErrUnavailable) || err.Error() != "x: adapter unavailable: closed" {
			t.Fatalf("Enter after Close = %v", err)
		}
	})
}

// TestGateCloseWithoutCalls: with nothing in flight Close runs fn at once.
func TestGateCloseWithoutCalls(t *testing.T) {
	var g bookkeep.Gate
	if err := g.Enter("x"); err != nil {
		t.Fatal(err)
	}
	g.Leave()
	if err := g.Close(func() error { return errors.New("boom") }); err == nil || err.Error() != "boom" || !g.Closed() {
		t.Fatalf("Close = %v, Closed %v", err, g.Closed())
	}
}

// TestStoredAgainWithNewSize: a key stored again with another size (an
// fs file or S3 object replaced by a full write after a short one) counts
// its new size once, in total and in its salt.
func TestStoredAgainWithNewSize(t *testing.T) {
	b := bookkeep.New(0)
	k := key(t, 1, "s")
	b.Stored([]objkey.Key{k}, []int64{10})
	b.Stored([]objkey.Key{k}, []int64{100})
	if u := b.Usage(); u.TotalBytesUsed != 100 || u.BytesByCacheSalt["s"] != 100 {
		t.Fatalf("usage after re-store = %+v, want 100", u)
	}
	b.Stored([]objkey.Key{k}, []int64{40})
	if u := b.Usage(); u.TotalBytesUsed != 40 || u.BytesByCacheSalt["s"] != 40 {
		t.Fatalf("usage after smaller re-store = %+v, want 40", u)
	}
	b.Forget([]objkey.Key{k})
	if u := b.Usage(); u.TotalBytesUsed != 0 || len(u.BytesByCacheSalt) != 0 {
		t.Fatalf("usage after forget = %+v, want 0", u)
	}
}

// TestBeginStoreWaitsForDelete: a store of a key being deleted waits for
// the delete's end (or fails with its context), and a delete skips a key
// being stored, so the two never overlap on one key.
func TestBeginStoreWaitsForDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := bookkeep.New(0)
		k := key(t, 1, "")
		b.Stored([]objkey.Key{k}, []int64{10})
		victims := b.BeginDelete([]objkey.Key{k})
		if len(victims) != 1 {
			t.Fatalf("BeginDelete = %v", victims)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancelled := make(chan error, 1)
		go func() { cancelled <- b.BeginStore(ctx, []objkey.Key{k}) }()
		admitted := make(chan error, 1)
		go func() { admitted <- b.BeginStore(context.Background(), []objkey.Key{k}) }()
		synctest.Wait()
		select {
		case err := <-admitted:
			t.Fatalf("BeginStore returned %v during the delete", err)
		default:
		}
		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled BeginStore = %v", err)
		}
		b.EndDelete(victims, victims)
		if err := <-admitted; err != nil {
			t.Fatal(err)
		}
		if got := b.BeginDelete([]objkey.Key{k}); len(got) != 0 {
			t.Fatalf("BeginDelete of a key being stored = %v, want none", got)
		}
		b.EndStore([]objkey.Key{k})
		if got := b.BeginDelete([]objkey.Key{k}); len(got) != 1 {
			t.Fatalf("BeginDelete after EndStore = %v, want the key", got)
		}
	})
}
