package kvcopy

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
)

// TestStreamRunsMatchReference: on random layouts (NHD, HND, MLA; 1, 2 and
// 4-byte items; head sizes whose rows are and are not 32-byte multiples),
// random block tables, skip counts and objects that start 32-byte aligned
// or 16 bytes off, the streaming loop writes exactly the bytes
// kvlayout's plain copy loop writes, in both directions, and nothing
// outside the plan. Without AVX2 the same walk runs on copy().
func TestStreamRunsMatchReference(t *testing.T) {
	if !haveStream {
		// streamRuns then copies every run with copy(): the test still
		// checks the plan walk, not the AVX2 kernel.
		t.Log("no streaming kernel on this CPU (amd64 with AVX2 only): checking the copy() fallback")
	}
	r := rand.New(rand.NewPCG(12, 12))
	formats := []string{"NHD", "HND", "MLA"}
	for iter := range 40 {
		p := &producer{format: formats[iter%3], nl: 1 + r.Int64N(3), nb: 4 + r.Int64N(12), bs: []int64{1, 2, 16}[r.IntN(3)],
			nh: 1 + r.Int64N(4), hs: []int64{8, 16, 24, 64, 80, 128}[r.IntN(6)], item: []int64{1, 2, 4}[r.IntN(3)]}
		if p.format == "MLA" {
			p.nh = 1
		}
		p.build(t, r)
		c, err := Open("", p.ws, Registration{Hints: hints(p)})
		if err != nil {
			t.Fatalf("iter %d %+v: %v", iter, p, err)
		}
		chunk := p.bs * (1 + r.Int64N(3))
		nchunks := 1 + r.IntN(3)
		bpc := chunk / p.bs
		blocks := make([]int64, int64(nchunks)*bpc)
		for i := range blocks {
			blocks[i] = r.Int64N(p.nb)
		}
		var chunks []kvlayout.Chunk
		ref, got := make([][]byte, nchunks), make([][]byte, nchunks)
		shift := int(r.IntN(2)) * 16
		for i := range nchunks {
			chunks = append(chunks, kvlayout.Chunk{Index: i, Obj: i})
			n := int(c.Layout.ObjectBytes(chunk))
			ref[i] = make([]byte, n)
			got[i] = make([]byte, n+64)[shift : shift+n]
		}
		plan, err := c.Layout.Plan(chunk, blocks, chunks, r.Int64N(chunk+1))
		if err != nil {
			t.Fatal(err)
		}
		plan.GatherRange(c.maps, ref, 0, len(plan.Runs))
		streamRuns(plan.Runs, c.maps, got, true)
		for i := range ref {
			if !bytes.Equal(ref[i], got[i]) {
				t.Fatalf("iter %d %+v shift %d: streamed store of object %d differs", iter, p, shift, i)
			}
		}
		// Retrieve: scatter random object bytes into zeroed segments both
		// ways and compare whole segments (untouched bytes stay zero).
		for i := range ref {
			for j := range ref[i] {
				ref[i][j] = byte(r.Uint32())
			}
			copy(got[i], ref[i])
		}
		want := make([][]byte, len(c.maps))
		for i, m := range c.maps {
			clear(m)
			want[i] = make([]byte, len(m))
		}
		plan.ScatterRange(want, ref, 0, len(plan.Runs))
		streamRuns(plan.Runs, c.maps, got, false)
		for i, m := range c.maps {
			if !bytes.Equal(m, want[i]) {
				t.Fatalf("iter %d %+v shift %d: streamed retrieve into segment %d differs", iter, p, shift, i)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamKernelRunLists drives the batched kernel with synthetic run
// lists the layouts do not produce: hundreds of runs (several kernel
// batches, so the prefetch cursor crosses batch and run boundaries),
// rows of 32 bytes to 4 KiB, counts of 1 to 40, gaps between rows,
// destinations on and off 32-byte alignment mixed within one batch (the
// off ones flush the batch and go through copy()), and prefetch
// distances of 0, 1, StreamAhead and more rows than the list holds. In
// both directions the bytes written equal the naive reference's
// (kvlayout's GatherRange / ScatterRange) and nothing else changes.
func TestStreamKernelRunLists(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 31))
	for iter := range 30 {
		nruns := 1 + r.IntN(300)
		if iter%5 == 0 {
			nruns = StreamBatch * (1 + r.IntN(3)) // whole batches exactly
		}
		const nbuf = 3
		var segEnd, objEnd [nbuf]int64
		p := &kvlayout.Plan{}
		for range nruns {
			ln := 32 * (1 + r.Int64N(128))
			if r.IntN(6) == 0 {
				ln = 1 + r.Int64N(300) // not a 32-byte multiple: copy() path
			}
			cnt := 1 + r.Int64N(40)
			gap := func() int64 { return []int64{0, 32, 64, 1792, int64(r.IntN(100))}[r.IntN(5)] }
			run := kvlayout.Run{Seg: int32(r.IntN(nbuf)), Obj: int32(r.IntN(nbuf)), Len: ln, Count: cnt,
				SegStep: ln + gap(), ObjStep: ln + gap()}
			if cnt == 1 {
				run.SegStep, run.ObjStep = 0, 0
			}
			run.SegOff = segEnd[run.Seg] + []int64{0, 32, 16}[r.IntN(3)]
			run.ObjOff = objEnd[run.Obj] + []int64{0, 32, 16}[r.IntN(3)]
			segEnd[run.Seg] = run.SegOff + (cnt-1)*run.SegStep + ln
			objEnd[run.Obj] = run.ObjOff + (cnt-1)*run.ObjStep + ln
			p.Runs = append(p.Runs, run)
			p.Bytes += ln * cnt
		}
		// Buffers start 32-byte aligned so the offsets decide alignment.
		alloc := func(n int64) []byte {
			b := make([]byte, n+32)
			off := (32 - int(uintptr(unsafe.Pointer(&b[0]))%32)) % 32
			return b[off : off+int(n)]
		}
		fill := func(bufs [][]byte) {
			for _, b := range bufs {
				for i := range b {
					b[i] = byte(r.Uint32())
				}
			}
		}
		clone := func(bufs [][]byte) [][]byte {
			out := make([][]byte, len(bufs))
			for i, b := range bufs {
				out[i] = alloc(int64(len(b)))
				copy(out[i], b)
			}
			return out
		}
		segs, objs := make([][]byte, nbuf), make([][]byte, nbuf)
		for i := range nbuf {
			segs[i], objs[i] = alloc(segEnd[i]+64), alloc(objEnd[i]+64)
		}
		if err := p.Check(segs, objs); err != nil {
			t.Fatalf("iter %d: generated plan: %v", iter, err)
		}
		ahead := []uintptr{0, 1, StreamAhead, 1 << 20}[iter%4]
		for _, gather := range []bool{true, false} {
			fill(segs)
			fill(objs)
			wantSegs, wantObjs := clone(segs), clone(objs)
			if gather {
				p.GatherRange(wantSegs, wantObjs, 0, len(p.Runs))
			} else {
				p.ScatterRange(wantSegs, wantObjs, 0, len(p.Runs))
			}
			streamRunsAhead(p.Runs, segs, objs, gather, ahead)
			for i := range nbuf {
				if !bytes.Equal(segs[i], wantSegs[i]) || !bytes.Equal(objs[i], wantObjs[i]) {
					t.Fatalf("iter %d (%d runs, ahead %d, gather %v): buffer %d differs from the reference", iter, nruns, ahead, gather, i)
				}
			}
		}
	}
}
