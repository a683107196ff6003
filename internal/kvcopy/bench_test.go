package kvcopy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
)

// BenchmarkCPUBackend measures store (Gather) and retrieve (Scatter) of
// 4 chunks of 256 tokens for a 16-layer, 8-head × 128 bf16 model (64 MiB
// per request, 16 MiB objects) against copy() of the same number of
// bytes between the same segments and objects (memcpy), interleaved in
// every iteration so machine noise hits all three alike. Block ids are
// shuffled, as a busy vLLM hands them out. Reported: GB/s of each and
// the ratios store/memcpy and retrieve/memcpy.
//
//	go test -run '^$' -bench BenchmarkCPUBackend -benchtime 40x ./internal/kvcopy/
func BenchmarkCPUBackend(b *testing.B) {
	for _, format := range []string{"NHD", "HND"} {
		b.Run(format, func(b *testing.B) {
			r := rand.New(rand.NewPCG(9, 9))
			p := &producer{format: format, nl: 16, nb: 64, bs: 16, nh: 8, hs: 128, item: 2}
			p.build(b, r)
			c, err := Open("", p.ws, Registration{Hints: hints(p)})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			const chunk = 256
			blocks := make([]int64, 64)
			for i, v := range r.Perm(64) {
				blocks[i] = int64(v)
			}
			var chunks []kvlayout.Chunk
			objs := make([][]byte, 4)
			for i := range objs {
				chunks = append(chunks, kvlayout.Chunk{Index: i, Obj: i})
				objs[i] = make([]byte, c.Layout.ObjectBytes(chunk))
			}
			plan, err := c.Layout.Plan(chunk, blocks, chunks, 0)
			if err != nil {
				b.Fatal(err)
			}
			memcpy := func() {
				// The same bytes, one copy per (segment, object) pair.
				for l, m := range p.maps {
					copy(objs[l%len(objs)][(l/len(objs))*len(m):], m)
				}
			}
			// Fault every page in first so no variant pays for first touches.
			memcpy()
			if err := c.Scatter(plan, objs); err != nil {
				b.Fatal(err)
			}
			var tm, ts, tr time.Duration
			b.SetBytes(3 * plan.Bytes)
			for b.Loop() {
				t0 := time.Now()
				memcpy()
				t1 := time.Now()
				if err := c.Gather(plan, objs); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				if err := c.Scatter(plan, objs); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				tm, ts, tr = tm+t1.Sub(t0), ts+t2.Sub(t1), tr+t3.Sub(t2)
			}
			gbs := func(d time.Duration) float64 { return float64(plan.Bytes) * float64(b.N) / d.Seconds() / 1e9 }
			b.ReportMetric(gbs(tm), "memcpy_GB/s")
			b.ReportMetric(gbs(ts), "store_GB/s")
			b.ReportMetric(gbs(tr), "retrieve_GB/s")
			b.ReportMetric(tm.Seconds()/ts.Seconds(), "store/memcpy")
			b.ReportMetric(tm.Seconds()/tr.Seconds(), "retrieve/memcpy")
			b.ReportMetric(float64(len(plan.Runs)), "runs")
		})
	}
}
