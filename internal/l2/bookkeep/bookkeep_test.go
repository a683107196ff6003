package bookkeep_test

import (
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/bookkeep"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

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
		if !b.TryLock(k1) {
			t.Fatal("TryLock")
		}
	}
	victims := b.BeginDelete([]objkey.Key{k1, k2, k2, k3})
	if !slices.Equal(victims, []objkey.Key{k2, k3}) {
		t.Fatalf("victims = %v", victims)
	}
	if b.TryLock(k2) {
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
	if !b.TryLock(k3) {
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
