package ledger

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// fill stores n distinct keys with 32-byte hashes over salts salts and 4
// models, as an MP fleet would report them.
func fill(n, salts int) *Ledger {
	l := New()
	batch, names := make([]Event, 0, 1000), saltNames(salts)
	for i := 0; i < n; i++ {
		k := distinctKey(i, names)
		batch = append(batch, Event{Op: OpStore, Key: k, Bytes: 2 << 20})
		if len(batch) == cap(batch) {
			l.Apply(batch)
			batch = batch[:0]
		}
	}
	l.Apply(batch)
	return l
}

// mappedBytes is the size of the index tables and entry pages mapped from
// the kernel.
func (l *Ledger) mappedBytes() uint64 {
	var n uint64
	for _, sl := range append([]*slab{l.indexSlab, l.oldSlab, l.nextSlab, l.spareSlab}, l.pageSlabs...) {
		if sl != nil {
			n += uint64(len(sl.mem))
		}
	}
	return n
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkLedgerMemory reports retained memory per tracked key: the heap
// delta plus the index tables and entry pages mapped outside the heap (run with
// -benchtime=1x).
func BenchmarkLedgerMemory(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				before := heap()
				l := fill(n, 10_000)
				after := heap()
				b.ReportMetric(float64(after-before+l.mappedBytes())/float64(n), "B/key")
				runtime.KeepAlive(l)
			}
		})
	}
}

// BenchmarkEvictionPlan times one plan over 10M keys in 10,000 salts:
// every salt over quota (2M victims at ratio 0.2), 10% of salts over
// quota, and none over quota.
func BenchmarkEvictionPlan(b *testing.B) {
	l := fill(10_000_000, 10_000)
	perSalt := int64(1000) * (2 << 20)
	for _, tc := range []struct {
		name string
		over int // salts over quota, of 10,000
	}{{"all_salts_over", 10_000}, {"10pct_salts_over", 1_000}, {"none_over", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			lim := quota.Limits{Explicit: map[string]int64{}}
			for i := 0; i < 10_000; i++ {
				v := perSalt * 2
				if i < tc.over {
					v = perSalt / 2
				}
				lim.Explicit[fmt.Sprintf("tenant-%05d", i)] = v
			}
			var victims int
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := l.ComputePlan(lim, PlanOptions{Ratio: 0.2, Watermark: 1, InflightTTL: 30 * time.Second})
				victims = p.Len()
			}
			b.ReportMetric(float64(victims), "victims")
			// Microseconds: a plan with nothing over quota takes well under
			// a millisecond, which whole milliseconds rounded to 0.
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "µs/plan")
		})
	}
}

// BenchmarkPlanMaterialize is the dispatch-side cost of the all-salts plan
// above: planning plus turning its 2,000,000 victims into object keys in
// 10,000-key chunks, as RunEvictionCycle does.
func BenchmarkPlanMaterialize(b *testing.B) {
	l := fill(10_000_000, 10_000)
	lim := quota.Limits{Explicit: map[string]int64{}}
	for i := 0; i < 10_000; i++ {
		lim.Explicit[fmt.Sprintf("tenant-%05d", i)] = int64(1000) * (2 << 20) / 2
	}
	b.ResetTimer()
	keys := 0
	for i := 0; i < b.N; i++ {
		p := l.ComputePlan(lim, PlanOptions{Ratio: 0.2, Watermark: 1})
		vs := p.Flat()
		keys = 0
		for start := 0; start < len(vs); start += 10_000 {
			ks, _ := l.Materialize(vs[start:min(start+10_000, len(vs))])
			keys += len(ks)
		}
	}
	b.ReportMetric(float64(keys), "keys")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
}

// BenchmarkPlanPinnedHead times the plans of a salt whose least recent
// keys are pinned. The first plan walks every pinned key, under the ledger
// lock, before it finds its victims among the 1,000 unpinned ones behind
// them, and parks them (see saltState); the plans after it start at the
// first unpinned key. Before parking, every cycle cost what the first does
// (BENCHMARKS.md §3a). Reported: the first plan (first-ms), the later ones
// (ms/plan) and their ratio.
func BenchmarkPlanPinnedHead(b *testing.B) {
	for _, pinned := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("pinned=%d", pinned), func(b *testing.B) {
			l := fill(pinned+1000, 1)
			names := saltNames(1)
			keys := make([]objkey.Key, pinned)
			for i := range keys {
				keys[i] = distinctKey(i, names).ObjectKey()
			}
			l.Pin(keys, 1)
			lim := quota.Limits{Explicit: map[string]int64{names[0]: 1}}
			opts := PlanOptions{Ratio: 0.001, Watermark: 1}
			start := time.Now()
			first := l.ComputePlan(lim, opts)
			firstMS := float64(time.Since(start).Microseconds()) / 1e3
			b.ResetTimer()
			var p *Plan
			for i := 0; i < b.N; i++ {
				p = l.ComputePlan(lim, opts)
			}
			perPlan := float64(b.Elapsed().Microseconds()) / 1e3 / float64(b.N)
			if p.Len() != first.Len() || first.Walked != pinned+first.Len() || p.Walked != p.Len() {
				b.Fatalf("first plan %d victims after walking %d, later %d after %d", first.Len(), first.Walked, p.Len(), p.Walked)
			}
			b.ReportMetric(float64(p.Len()), "victims")
			b.ReportMetric(firstMS, "first-ms")
			b.ReportMetric(perPlan, "ms/plan")
			b.ReportMetric(perPlan/firstMS, "later/first")
		})
	}
}

// BenchmarkApplyBatch is the ledger half of ingest: 1,000 prepared store
// events into a 200k-key ledger.
func BenchmarkApplyBatch(b *testing.B) {
	l := fill(200_000, 1000)
	src := fill(0, 1)
	_ = src
	batch := make([]Event, 1000)
	for i := range batch {
		var k Key
		j := uint64(i * 199)
		binary.LittleEndian.PutUint64(k.hash[0:], j*0x9E3779B97F4A7C15)
		binary.LittleEndian.PutUint64(k.hash[8:], j)
		binary.LittleEndian.PutUint64(k.hash[16:], ^j)
		binary.LittleEndian.PutUint64(k.hash[24:], j*31)
		k.hlen = 32
		k.Model, k.Salt, k.Rank = "Qwen/Qwen3-8B", fmt.Sprintf("tenant-%05d", i%1000), 16777472
		batch[i] = Event{Op: OpStore, Key: k, Bytes: 1}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.Apply(batch)
	}
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkPlanIngestWait runs the all-salts plan of BenchmarkEvictionPlan
// (4M keys in 4,000 salts, 800,000 victims) while another goroutine applies
// one-event store batches back to back, and reports the longest an Apply
// took during the plan, with the plan holding the lock throughout (hold=all,
// the behaviour before the plan yielded) and with the default planHold.
func BenchmarkPlanIngestWait(b *testing.B) {
	l := fill(4_000_000, 4_000)
	lim := quota.Limits{Explicit: map[string]int64{}}
	for i := 0; i < 4_000; i++ {
		lim.Explicit[fmt.Sprintf("tenant-%05d", i)] = 1
	}
	ev := []Event{{Op: OpStore, Key: distinctKey(0, saltNames(1)), Bytes: 1}}
	for _, mode := range []struct {
		name string
		hold time.Duration
	}{{"hold=all", -1}, {"hold=default", 0}} {
		b.Run(mode.name, func(b *testing.B) {
			l.holdFor = mode.hold
			var worst, planTime time.Duration
			victims := 0
			for i := 0; i < b.N; i++ {
				stop := make(chan struct{})
				done := make(chan time.Duration)
				go func() {
					var longest time.Duration
					for {
						select {
						case <-stop:
							done <- longest
							return
						default:
						}
						t := time.Now()
						l.Apply(ev)
						longest = max(longest, time.Since(t))
					}
				}()
				start := time.Now()
				victims = l.ComputePlan(lim, PlanOptions{Ratio: 0.2, Watermark: 1}).Len()
				planTime += time.Since(start)
				close(stop)
				worst = max(worst, <-done)
			}
			b.ReportMetric(float64(victims), "victims")
			b.ReportMetric(float64(planTime.Microseconds())/1e3/float64(b.N), "plan-ms")
			b.ReportMetric(float64(worst.Microseconds())/1e3, "max-apply-ms")
		})
	}
}
