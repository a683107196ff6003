package eviction

import (
	"fmt"
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

func key(salt string, chunk int) objkey.Key {
	return objkey.Key{ChunkHash: fmt.Sprintf("h%03d", chunk), ModelName: "m", KVRank: objkey.RankFor(1, 0), CacheSalt: salt}
}

func keys(salt string, chunks ...int) []objkey.Key {
	out := make([]objkey.Key, len(chunks))
	for i, c := range chunks {
		out[i] = key(salt, c)
	}
	return out
}

func all(objkey.Key) bool { return true }

func TestTarget(t *testing.T) {
	cases := []struct {
		n     int
		ratio float64
		want  int
	}{{10, 0.2, 2}, {3, 0.2, 1}, {0, 0.2, 0}, {10, 0, 0}, {10, 1.5, 10}, {10, 1, 10}, {7, 0.5, 3}}
	for _, c := range cases {
		if got := Target(c.n, c.ratio); got != c.want {
			t.Errorf("Target(%d, %v) = %d, want %d", c.n, c.ratio, got, c.want)
		}
	}
}

// TestLRUOrder checks oldest-first victims and that Touch refreshes a key.
func TestLRUOrder(t *testing.T) {
	l := NewLRU()
	l.Add(keys("", 1))
	l.Add(keys("", 2))
	l.Add(keys("", 3))
	l.Touch(keys("", 1))
	if got, want := l.Order(), keys("", 2, 3, 1); !slices.Equal(got, want) {
		t.Fatalf("order = %v, want %v", got, want)
	}
	if got, want := l.Victims(0.67, all), keys("", 2, 3); !slices.Equal(got, want) {
		t.Fatalf("victims = %v, want %v", got, want)
	}
	l.Remove(keys("", 2))
	if l.Len() != 2 {
		t.Fatalf("len = %d, want 2", l.Len())
	}
	if got, want := l.Victims(0.1, all), keys("", 3); !slices.Equal(got, want) {
		t.Fatalf("victims after remove = %v, want %v", got, want)
	}
}

// TestTailFirstWithinRequest: one request's chunks inserted together are
// evicted last chunk first, so the cached prefix survives longest.
func TestTailFirstWithinRequest(t *testing.T) {
	for _, p := range []Policy{NewLRU(), NewIsolatedLRU()} {
		p.Add(keys("s", 0, 1, 2, 3))
		if got, want := p.Victims(0.5, all), keys("s", 3, 2); !slices.Equal(got, want) {
			t.Fatalf("%T victims = %v, want %v (tail first)", p, got, want)
		}
		// Touching the request again keeps the same rule.
		p.Add(keys("s", 10))
		p.Touch(keys("s", 0, 1, 2, 3))
		if got, want := p.Victims(0.2, all), keys("s", 10); !slices.Equal(got, want) {
			t.Fatalf("%T victims after touch = %v, want %v", p, got, want)
		}
	}
}

// TestVictimsSkipIneligible: locked keys are skipped and do not count
// toward the target.
func TestVictimsSkipIneligible(t *testing.T) {
	l := NewLRU()
	for i := range 10 {
		l.Add(keys("", i))
	}
	locked := map[objkey.Key]bool{key("", 0): true, key("", 1): true}
	got := l.Victims(0.2, func(k objkey.Key) bool { return !locked[k] })
	if want := keys("", 2, 3); !slices.Equal(got, want) {
		t.Fatalf("victims = %v, want %v", got, want)
	}
	none := l.Victims(1, func(objkey.Key) bool { return false })
	if len(none) != 0 {
		t.Fatalf("victims with nothing eligible = %v", none)
	}
}

func TestIsolatedLRUPerSalt(t *testing.T) {
	p := NewIsolatedLRU()
	p.Add(append(keys("a", 1, 2), keys("b", 1)...))
	p.Add(keys("a", 3))
	if p.Len() != 4 || p.SaltLen("a") != 3 || p.SaltLen("b") != 1 {
		t.Fatalf("len=%d a=%d b=%d", p.Len(), p.SaltLen("a"), p.SaltLen("b"))
	}
	if got := p.Salts(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("salts = %v", got)
	}
	// Salt a's victims never include salt b's keys.
	if got, want := p.SaltVictims("a", 1, all), keys("a", 2, 1, 3); !slices.Equal(got, want) {
		t.Fatalf("a victims = %v, want %v", got, want)
	}
	if got := p.SaltVictims("c", 1, all); got != nil {
		t.Fatalf("unknown salt victims = %v", got)
	}
	p.Remove(keys("b", 1))
	if p.SaltLen("b") != 0 || p.Len() != 3 || slices.Contains(p.Salts(), "b") {
		t.Fatalf("after remove: len=%d salts=%v", p.Len(), p.Salts())
	}
	// Re-adding a tracked key does not double count.
	p.Add(keys("a", 1))
	if p.Len() != 3 {
		t.Fatalf("len after re-add = %d, want 3", p.Len())
	}
}

func TestNewAndNoop(t *testing.T) {
	for _, n := range []string{LRUName, IsolatedLRUName, NoopName} {
		if _, err := New(n); err != nil {
			t.Fatalf("New(%q): %v", n, err)
		}
	}
	if _, err := New("lru"); err == nil {
		t.Fatal("New(lru) accepted a misspelt policy")
	}
	var p Policy = Noop{}
	p.Add(keys("", 1))
	if p.Len() != 0 || p.Victims(1, all) != nil {
		t.Fatal("noop tracked something")
	}
}

func BenchmarkLRUAddTouchRemove(b *testing.B) {
	l := NewLRU()
	ks := keys("", 0, 1, 2, 3, 4, 5, 6, 7)
	b.ReportAllocs()
	for b.Loop() {
		l.Add(ks)
		l.Touch(ks)
		l.Remove(ks)
	}
}
