package kvcopy

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
)

// TestSplitCoversPlan: split cuts a plan into k ascending ranges that
// together cover every run once, of roughly equal bytes.
func TestSplitCoversPlan(t *testing.T) {
	p := &kvlayout.Plan{}
	for i := range 100 {
		p.Runs = append(p.Runs, kvlayout.Run{Len: int64(100 + i%7), Count: 1})
		p.Bytes += int64(100 + i%7)
	}
	for _, k := range []int{1, 2, 3, 8, 100, 200} {
		parts := split(p, k)
		if parts[0] != 0 || len(parts) > min(k, 100) || (k <= 8 && len(parts) != k) {
			t.Fatalf("k=%d: parts %v", k, parts)
		}
		for i := 1; i < len(parts); i++ {
			if parts[i] <= parts[i-1] || parts[i] >= len(p.Runs) {
				t.Fatalf("k=%d: parts %v not ascending inside the plan", k, parts)
			}
		}
		if k == 2 && (parts[1] < 45 || parts[1] > 55) {
			t.Fatalf("k=2 splits at run %d of 100 equal-ish runs", parts[1])
		}
	}
}

// TestParallelCopyMatchesSequential: a 64 MiB HND request, copied by
// several goroutines, gives the bytes a single-goroutine copy gives, both
// ways; a fault in any goroutine fails the whole request.
func TestParallelCopyMatchesSequential(t *testing.T) {
	if n := copyWorkers(64 << 20); n < 2 {
		t.Logf("GOMAXPROCS %d: the copy runs on %d goroutine(s)", runtime.GOMAXPROCS(0), n)
	}
	prev := runtime.GOMAXPROCS(4) // the split is exercised on any machine
	defer runtime.GOMAXPROCS(prev)
	r := rand.New(rand.NewPCG(5, 5))
	p := &producer{format: "HND", nl: 16, nb: 64, bs: 16, nh: 8, hs: 128, item: 2}
	p.build(t, r)
	c, err := Open("", p.ws, Registration{Hints: hints(p)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	blocks := make([]int64, 64)
	for i, v := range r.Perm(64) {
		blocks[i] = int64(v)
	}
	chunks := make([]kvlayout.Chunk, 4)
	objs := make([][]byte, 4)
	for i := range chunks {
		chunks[i] = kvlayout.Chunk{Index: i, Obj: i}
		objs[i] = make([]byte, c.Layout.ObjectBytes(256))
	}
	plan, err := c.Layout.Plan(256, blocks, chunks, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := copyWorkers(plan.Bytes); n != 4 {
		t.Fatalf("a %d-byte request copies on %d goroutines, want 4", plan.Bytes, n)
	}
	if err := c.Gather(plan, objs); err != nil {
		t.Fatal(err)
	}
	for i := range objs {
		if want := p.object(blocks[i*16 : (i+1)*16]); !bytes.Equal(objs[i], want) {
			t.Fatalf("object %d differs from the KV_2LTD definition", i)
		}
	}
	// Scatter into a zeroed copy of the cache and compare with the original.
	orig := make([][]byte, len(p.maps))
	for i, m := range p.maps {
		orig[i] = bytes.Clone(m)
		clear(m)
	}
	if err := c.Scatter(plan, objs); err != nil {
		t.Fatal(err)
	}
	for i, m := range p.maps {
		if !bytes.Equal(m, orig[i]) {
			t.Fatalf("layer %d after a parallel scatter differs", i)
		}
	}
	// The last layer's segment is cut: the goroutine copying it faults.
	if err := os.Truncate(filepath.Join(DefaultDir, p.names[len(p.names)-1]), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Gather(plan, objs); !errors.Is(err, ErrFault) {
		t.Fatalf("parallel Gather over a truncated segment: %v, want ErrFault", err)
	}
}
