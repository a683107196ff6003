package ledger

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

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
		_, _, _, _, found := l.findH(&c, l.hashOf(&c))
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
	ks := planKeys(l, p)
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

// TestPlanMatchesReference checks the lock-step multi-lane walk against a
// plain per-salt walk over many salts of different sizes, with pins.
func TestPlanMatchesReference(t *testing.T) {
	l := New()
	r := rand.New(rand.NewPCG(3, 4))
	order := map[string][]string{} // salt -> hashes in LRU order
	var pinned []objkey.Key
	for s := 0; s < 50; s++ {
		salt := fmt.Sprintf("s%02d", s)
		for i := 0; i < r.IntN(30); i++ {
			h := fmt.Sprintf("%02x%04x", s, i)
			l.Apply([]Event{{Op: OpStore, Key: key(t, h, "m", salt), Bytes: 10}})
			order[salt] = append(order[salt], h)
			if r.IntN(5) == 0 {
				raw, _ := objkey.FromHex(h)
				pinned = append(pinned, objkey.Key{ChunkHash: string(raw), ModelName: "m", CacheSalt: salt})
			}
		}
	}
	l.Pin(pinned, 1)
	isPinned := map[string]bool{}
	for _, k := range pinned {
		isPinned[k.CacheSalt+"/"+k.HashHex()] = true
	}
	zero := int64(0)
	lim := quota.Limits{Explicit: map[string]int64{}, Default: &zero}
	for s := 0; s < 50; s += 3 {
		lim.Explicit[fmt.Sprintf("s%02d", s)] = 1 << 40 // under quota
	}
	for _, ratio := range []float64{0.3, 1} {
		lim := lim
		p := l.ComputePlan(lim, PlanOptions{Ratio: ratio, Watermark: 1})
		got := planBySalt(l, p)
		for s := 0; s < 50; s++ {
			salt := fmt.Sprintf("s%02d", s)
			var want []string
			if lim.Explicit[salt] == 0 && len(order[salt]) > 0 {
				target := len(order[salt]) // default limit 0: ratio 1
				taken := 0
				for _, h := range order[salt] {
					if taken == target {
						break
					}
					if isPinned[salt+"/"+h] {
						continue
					}
					taken++
					want = append(want, h)
				}
			}
			var have []string
			for _, k := range got[salt] {
				have = append(have, k.HashHex())
			}
			if fmt.Sprint(have) != fmt.Sprint(want) {
				t.Fatalf("ratio %v salt %s: got %v want %v", ratio, salt, have, want)
			}
		}
	}
	// Explicit quotas use the ratio: a 0.3 plan over salt s00 (under quota
	// above) once its quota is tiny.
	lim.Explicit["s00"] = 1
	p := l.ComputePlan(lim, PlanOptions{Ratio: 0.3, Watermark: 1})
	n := len(order["s00"])
	target := int(float64(n) * 0.3)
	if target == 0 && n > 0 {
		target = 1
	}
	// Pinned keys count toward the pool but are skipped, not counted.
	want := 0
	for _, h := range order["s00"] {
		if want < target && !isPinned["s00/"+h] {
			want++
		}
	}
	if got := len(planBySalt(l, p)["s00"]); got != want {
		t.Fatalf("s00: %d victims, want %d", got, want)
	}
}

// TestMaterializeDropsDeletedVictims: a victim whose entry is deleted (and
// its slot reused) between planning and dispatch is not sent.
func TestMaterializeDropsDeletedVictims(t *testing.T) {
	l := New()
	for i := 0; i < 3; i++ {
		l.Apply([]Event{{Op: OpStore, Key: key(t, fmt.Sprintf("%02x", i), "m", "s"), Bytes: 1}})
	}
	zero := int64(0)
	p := l.ComputePlan(quota.Limits{Default: &zero}, PlanOptions{Ratio: 1, Watermark: 1})
	l.Apply([]Event{{Op: OpDelete, Key: key(t, "01", "m", "s")}, {Op: OpStore, Key: key(t, "ff", "m", "s"), Bytes: 1}})
	keys, live := l.Materialize(p.Flat())
	if len(keys) != 2 || len(live) != 2 || keys[0].HashHex() != "00" || keys[1].HashHex() != "02" {
		t.Fatalf("materialized %v", keys)
	}
}

// TestEntryLayout pins the per-key footprint the memory figures rely on.
func TestEntryLayout(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 80 {
		t.Fatalf("entry is %d bytes, want 80", n)
	}
	if n := unsafe.Sizeof(Victim{}); n != 8 {
		t.Fatalf("Victim is %d bytes, want 8", n)
	}
}

// planKeys materializes a whole plan in plan order.
func planKeys(l *Ledger, p *Plan) []objkey.Key {
	keys, _ := l.Materialize(p.Flat())
	return keys
}

// planBySalt materializes a plan grouped by salt.
func planBySalt(l *Ledger, p *Plan) map[string][]objkey.Key {
	out := map[string][]objkey.Key{}
	for si, vs := range p.Victims {
		keys, _ := l.Materialize(vs)
		out[p.Salts[si]] = keys
	}
	return out
}

// TestApplyCountsMissedDeletes: Counts.DeleteMissed is the deletes of keys
// the ledger did not hold, an unknown name's included; Delete counts all.
func TestApplyCountsMissedDeletes(t *testing.T) {
	l := New()
	held, gone := key(t, "0a", "m", "s"), key(t, "0b", "m", "s")
	l.Apply([]Event{{Op: OpStore, Key: held, Bytes: 10}})
	c := l.Apply([]Event{{Op: OpDelete, Key: held}, {Op: OpDelete, Key: gone}, {Op: OpDelete, Key: key(t, "0c", "other-model", "other-salt")}})
	if c.Delete != 3 || c.DeleteMissed != 2 {
		t.Errorf("counts %+v, want Delete 3, DeleteMissed 2", c)
	}
	if c := l.Apply([]Event{{Op: OpDelete, Key: held}}); c.DeleteMissed != 1 {
		t.Errorf("deleting it again: %+v, want DeleteMissed 1", c)
	}
}
