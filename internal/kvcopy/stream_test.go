package kvcopy

import (
	"bytes"
	"math/rand/v2"
	"testing"

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
