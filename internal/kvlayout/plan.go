package kvlayout

import (
	"fmt"

	"github.com/lmcache-go/lmcache/internal/overflow"
)

// Run is Count equal-length byte copies between a paged segment and an
// object: copy k moves Len bytes from SegOff+k·SegStep to ObjOff+k·ObjStep
// (or back). Count is 1 for a plain contiguous copy; HND-style layouts,
// whose rows are short and evenly spaced, become one strided Run per
// (kv, layer, block, head) instead of one per token.
type Run struct {
	// Seg and Obj index the executor's segments and objects.
	Seg, Obj int32
	// SegOff and ObjOff are byte offsets; Len is the byte count.
	SegOff, ObjOff, Len int64
	// Count repetitions, advancing by SegStep / ObjStep (both ≥ 0).
	Count            int64
	SegStep, ObjStep int64
}

// fits reports whether count copies of n bytes from off, step apart,
// end within size. All arguments are non-negative and count ≥ 1. The
// first test is a range check (n > size-off cannot wrap); the product
// goes through overflow.Mul, since (count-1)·step of two values each below 2^50
// can pass 2^63 and wrap to a small end.
func fits(off, step, n, count, size int64) bool {
	if off > size || n > size-off {
		return false
	}
	span, ok := overflow.Mul(count-1, step)
	return ok && span <= size-off-n
}

// Plan is a list of copies between paged blocks and chunk objects. The
// same plan serves both directions: Gather (store: blocks → objects) and
// Scatter (retrieve: objects → blocks).
type Plan struct {
	Runs []Run
	// Bytes is the total copied.
	Bytes int64
}

// Chunk selects one chunk of a request's token range for a plan.
type Chunk struct {
	// Index is the chunk's position within the range [start, end): its
	// blocks are blockIDs[Index·bpc : (Index+1)·bpc].
	Index int
	// Obj is the object buffer the chunk goes to or comes from.
	Obj int
}

// BlocksPerChunk is chunkSize / BlockSize; the chunk size must be a
// positive multiple of the block size (vLLM's connector asserts the same).
func (l *Layout) BlocksPerChunk(chunkSize int64) (int64, error) {
	if chunkSize <= 0 || chunkSize%l.BlockSize != 0 {
		return 0, fmt.Errorf("%w: chunk size %d is not a multiple of block size %d", ErrBadRequest, chunkSize, l.BlockSize)
	}
	return chunkSize / l.BlockSize, nil
}

// template is the coalesced copy list for tokens [t0, t1) of one block of
// one (kv, layer): SegOff relative to the block's (kv, block) origin,
// ObjOff relative to the block's first row in the object. Rows are walked
// token-major and head-major and the shorter list is kept: NHD merges
// token-major into one copy per block, HND head-major into one strided
// run per head.
func (l *Layout) template(t0, t1 int64) []Run {
	a := l.walk(t0, t1, false)
	if b := l.walk(t0, t1, true); len(b) < len(a) {
		return b
	}
	return a
}

func (l *Layout) walk(t0, t1 int64, headMajor bool) []Run {
	var out []Run
	item := l.ItemSize
	atom, perDim := l.HeadSize*item, false
	if l.sD != 1 {
		atom, perDim = item, true
	}
	add := func(t, h int64) {
		src := (t*l.sT + h*l.sH) * item
		dst := (t*l.NumHeads + h) * l.HeadSize * item
		if !perDim {
			out = appendRun(out, Run{SegOff: src, ObjOff: dst, Len: atom, Count: 1})
			return
		}
		for d := range l.HeadSize {
			out = appendRun(out, Run{SegOff: src + d*l.sD*item, ObjOff: dst + d*item, Len: atom, Count: 1})
		}
	}
	if headMajor {
		for h := range l.NumHeads {
			for t := t0; t < t1; t++ {
				add(t, h)
			}
		}
		return out
	}
	for t := t0; t < t1; t++ {
		for h := range l.NumHeads {
			add(t, h)
		}
	}
	return out
}

// appendRun adds r (a single copy), merging it into the last run when
// both sides continue it (NHD's rows become one copy per run of
// consecutive blocks) or when it is the next step of an evenly spaced
// series of equal copies.
func appendRun(runs []Run, r Run) []Run {
	if n := len(runs); n > 0 && r.Count == 1 {
		p := &runs[n-1]
		if p.Seg == r.Seg && p.Obj == r.Obj {
			switch {
			case p.Count == 1 && p.SegOff+p.Len == r.SegOff && p.ObjOff+p.Len == r.ObjOff:
				p.Len += r.Len
				return runs
			case p.Len != r.Len:
			case p.Count == 1 && r.SegOff >= p.SegOff+p.Len && r.ObjOff >= p.ObjOff+p.Len:
				p.Count, p.SegStep, p.ObjStep = 2, r.SegOff-p.SegOff, r.ObjOff-p.ObjOff
				return runs
			case p.Count > 1 && r.SegOff == p.SegOff+p.Count*p.SegStep && r.ObjOff == p.ObjOff+p.Count*p.ObjStep:
				p.Count++
				return runs
			}
		}
	}
	return append(runs, r)
}

// Plan builds the copies for chunks of a request whose range starts at
// chunk 0 of blockIDs. Tokens before skipTokens (counted from the start
// of the range) are left out, so a retrieve never writes blocks, or the
// part of a block, that the engine already holds. Every block id is
// checked before anything is planned.
func (l *Layout) Plan(chunkSize int64, blockIDs []int64, chunks []Chunk, skipTokens int64) (*Plan, error) {
	bpc, err := l.BlocksPerChunk(chunkSize)
	if err != nil {
		return nil, err
	}
	if skipTokens < 0 {
		return nil, fmt.Errorf("%w: skip_first_n_tokens %d", ErrBadRequest, skipTokens)
	}
	for _, c := range chunks {
		if c.Index < 0 || c.Obj < 0 || c.Obj > 1<<30 {
			return nil, fmt.Errorf("%w: chunk %d object %d", ErrBadRequest, c.Index, c.Obj)
		}
		// Through overflow.Mul: (Index+1)·bpc of a huge index wraps, to a small
		// count (the chunk would read chunk 0's blocks) or a negative one
		// (a slice panic). Index+1 wraps only for Index = MaxInt64, to a
		// negative operand that overflow.Mul refuses.
		if end, ok := overflow.Mul(int64(c.Index)+1, bpc); !ok || end > int64(len(blockIDs)) {
			return nil, fmt.Errorf("%w: chunk %d needs %d block ids from id %d·%d, got %d", ErrBadRequest, c.Index, bpc, c.Index, bpc, len(blockIDs))
		}
		for _, b := range blockIDs[int64(c.Index)*bpc : (int64(c.Index)+1)*bpc] {
			if b < 0 || b >= l.NumBlocks {
				return nil, fmt.Errorf("%w: block id %d outside [0, %d)", ErrBadRequest, b, l.NumBlocks)
			}
		}
	}
	nkv := int64(2)
	if l.MLA() {
		nkv = 1
	}
	item, rowBytes := l.ItemSize, l.Hidden()*l.ItemSize
	p := &Plan{}
	for _, c := range chunks {
		first := int64(c.Index) * chunkSize
		for kv := range nkv {
			for li, la := range l.layers {
				for j := range bpc {
					lo := first + j*l.BlockSize
					if lo+l.BlockSize <= skipTokens {
						continue
					}
					tmpl := l.blockTemplate
					if lo < skipTokens {
						tmpl = l.template(skipTokens-lo, l.BlockSize)
					}
					bid := blockIDs[int64(c.Index)*bpc+j]
					src := la.base + (kv*l.sKV+bid*l.sB)*item
					dst := ((kv*l.NumLayers+int64(li))*chunkSize + j*l.BlockSize) * rowBytes
					for _, r := range tmpl {
						r.Seg, r.Obj, r.SegOff, r.ObjOff = int32(la.seg), int32(c.Obj), src+r.SegOff, dst+r.ObjOff
						if r.Count == 1 {
							p.Runs = appendRun(p.Runs, r)
						} else {
							p.Runs = append(p.Runs, r)
						}
						p.Bytes += r.Count * r.Len
					}
				}
			}
		}
	}
	return p, nil
}

// Check verifies every run lies inside its segment and object, so a plan
// either runs whole or not at all.
func (p *Plan) Check(segs, objs [][]byte) error {
	sl, ol := make([]int64, len(segs)), make([]int64, len(objs))
	for i, s := range segs {
		sl[i] = int64(len(s))
	}
	for i, o := range objs {
		ol[i] = int64(len(o))
	}
	return p.CheckSizes(sl, ol)
}

// CheckSizes is Check for segments and objects known by their byte
// lengths (device memory the process cannot slice).
func (p *Plan) CheckSizes(segs, objs []int64) error {
	for _, r := range p.Runs {
		if r.Seg < 0 || int(r.Seg) >= len(segs) || r.Obj < 0 || int(r.Obj) >= len(objs) {
			return fmt.Errorf("%w: run names segment %d / object %d of %d / %d", ErrBadRequest, r.Seg, r.Obj, len(segs), len(objs))
		}
		// Plans come from Plan, whose offsets are bounded by the layout;
		// anything larger than this is not one of its runs.
		const lim = 1 << 50
		if r.Count < 1 || r.Count > lim || r.Len < 0 || r.Len > lim || r.SegStep < 0 || r.SegStep > lim ||
			r.ObjStep < 0 || r.ObjStep > lim || r.SegOff < 0 || r.SegOff > lim || r.ObjOff < 0 || r.ObjOff > lim {
			return fmt.Errorf("%w: malformed run %+v", ErrBadRequest, r)
		}
		if !fits(r.SegOff, r.SegStep, r.Len, r.Count, segs[r.Seg]) {
			return fmt.Errorf("%w: run %+v ends past segment %d (%d bytes)", ErrBadRequest, r, r.Seg, segs[r.Seg])
		}
		if !fits(r.ObjOff, r.ObjStep, r.Len, r.Count, objs[r.Obj]) {
			return fmt.Errorf("%w: run %+v ends past object %d (%d bytes)", ErrBadRequest, r, r.Obj, objs[r.Obj])
		}
	}
	return nil
}

// Gather copies blocks into objects (store) after checking every run.
func (p *Plan) Gather(segs, objs [][]byte) error {
	if err := p.Check(segs, objs); err != nil {
		return err
	}
	p.GatherRange(segs, objs, 0, len(p.Runs))
	return nil
}

// Scatter copies objects into blocks (retrieve) after checking every run.
func (p *Plan) Scatter(segs, objs [][]byte) error {
	if err := p.Check(segs, objs); err != nil {
		return err
	}
	p.ScatterRange(segs, objs, 0, len(p.Runs))
	return nil
}

// GatherRange runs Runs[lo:hi] in the store direction. The caller has
// run Check; disjoint ranges may run concurrently.
func (p *Plan) GatherRange(segs, objs [][]byte, lo, hi int) {
	for _, r := range p.Runs[lo:hi] {
		copyRun(objs[r.Obj], r.ObjOff, r.ObjStep, segs[r.Seg], r.SegOff, r.SegStep, r.Len, r.Count)
	}
}

// ScatterRange runs Runs[lo:hi] in the retrieve direction (see
// GatherRange).
func (p *Plan) ScatterRange(segs, objs [][]byte, lo, hi int) {
	for _, r := range p.Runs[lo:hi] {
		copyRun(segs[r.Seg], r.SegOff, r.SegStep, objs[r.Obj], r.ObjOff, r.ObjStep, r.Len, r.Count)
	}
}

// copyRun does count copies of n bytes from src[so+k·ss] to dst[do+k·ds].
func copyRun(dst []byte, do, ds int64, src []byte, so, ss int64, n, count int64) {
	for range count {
		copy(dst[do:do+n], src[so:so+n])
		do, so = do+ds, so+ss
	}
}
