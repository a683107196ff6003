package ledger

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func key(t testing.TB, hash, model, salt string) Key {
	t.Helper()
	k, err := Prepare(&objkey.Encoded{ChunkHashHex: hash, ModelName: model, CacheSalt: salt})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestIndexMatchesMap drives random stores and deletes and checks the
// open-addressing index against a plain map (backward-shift deletion).
func TestIndexMatchesMap(t *testing.T) {
	l := New()
	ref := map[string]int64{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		h := fmt.Sprintf("%04x", r.IntN(5000))
		k := key(t, h, "m", "s")
		if r.IntN(3) == 0 {
			l.Apply([]Event{{Op: OpDelete, Key: k}})
			delete(ref, h)
		} else {
			sz := int64(r.IntN(100) + 1)
			l.Apply([]Event{{Op: OpStore, Key: k, Bytes: sz}})
			ref[h] = sz
		}
	}
	var want int64
	for _, v := range ref {
		want += v
	}
	st := l.Stats()
	if st.Keys != len(ref) || st.Bytes != want {
		t.Fatalf("ledger has %d keys %d bytes, want %d keys %d bytes", st.Keys, st.Bytes, len(ref), want)
	}
	for h := range ref {
		k := key(t, h, "m", "s")
		l.mu.Lock()
		c, ok := l.lookupKey(&k)
		_, _, _, found := l.find(&c)
		l.mu.Unlock()
		if !ok || !found {
			t.Fatalf("key %s lost", h)
		}
	}
}

func TestLongHashAndGroupRoundTrip(t *testing.T) {
	l := New()
	long := ""
	for i := 0; i < 40; i++ {
		long += "ab"
	}
	k1, err := Prepare(&objkey.Encoded{ChunkHashHex: long, ModelName: "m", CacheSalt: "s", ObjectGroupID: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	l.Apply([]Event{{Op: OpStore, Key: k1, Bytes: 10}})
	zero := int64(0)
	p := l.ComputePlan(quota.Limits{Default: &zero}, PlanOptions{Ratio: 1, Watermark: 1})
	ks := p.Keys()
	if len(ks) != 1 || ks[0].HashHex() != long || ks[0].ObjectGroupID != 1<<40 {
		t.Fatalf("got %+v", ks)
	}
}

func TestInflightWithheldThenResent(t *testing.T) {
	l := New()
	for i := 0; i < 4; i++ {
		l.Apply([]Event{{Op: OpStore, Key: key(t, fmt.Sprintf("%02x", i), "m", "s"), Bytes: 10}})
	}
	zero := int64(0)
	lim := quota.Limits{Default: &zero}
	t0 := time.Now()
	p1 := l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1, InflightTTL: 10 * time.Second, Now: t0, Mark: true})
	if p1.Len() != 4 {
		t.Fatalf("first plan %d", p1.Len())
	}
	p2 := l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1, InflightTTL: 10 * time.Second, Now: t0.Add(time.Second), Mark: true})
	if p2.Len() != 0 || p2.InFlight != 4 {
		t.Fatalf("second plan %d inflight %d", p2.Len(), p2.InFlight)
	}
	p3 := l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1, InflightTTL: 10 * time.Second, Now: t0.Add(12 * time.Second), Mark: true})
	if p3.Len() != 4 {
		t.Fatalf("expired plan %d", p3.Len())
	}
	l.Unmark(p3.Victims[0])
	p4 := l.ComputePlan(lim, PlanOptions{Ratio: 1, Watermark: 1, InflightTTL: 10 * time.Second, Now: t0.Add(13 * time.Second)})
	if p4.Len() != 4 {
		t.Fatalf("unmarked plan %d", p4.Len())
	}
}
