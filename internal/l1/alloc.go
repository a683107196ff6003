package l1

import (
	"errors"
	"fmt"
	"math/bits"
)

// ErrOutOfMemory is returned when a batch does not fit; nothing was
// allocated.
var ErrOutOfMemory = errors.New("l1: out of memory")

// sameClassScan bounds the search for a fit among extents of the request's
// own size class before larger classes are considered.
const sameClassScan = 64

// Allocator hands out aligned extents [off, off+size) of a region. It is an
// extent allocator: free space is a set of maximal extents indexed by start
// and end (for O(1) coalescing on Free) and by power-of-two size class (for
// finding a fit without scanning everything). KV chunks of one model all
// have the same size, so a freed extent is usually an exact fit for the next
// allocation and fragmentation stays low.
//
// Allocator is not safe for concurrent use; the Table serializes it.
type Allocator struct {
	align   int64
	total   int64
	used    int64
	byStart map[int64]int64 // free extent start -> size
	byEnd   map[int64]int64 // free extent end -> start
	classes [64]map[int64]struct{}
}

// NewAllocator manages [0, total) with the given alignment (a power of two;
// total is rounded down to it).
func NewAllocator(total, align int64) *Allocator {
	if align <= 0 || align&(align-1) != 0 {
		panic(fmt.Sprintf("l1: align %d is not a power of two", align))
	}
	a := &Allocator{align: align, total: total &^ (align - 1), byStart: map[int64]int64{}, byEnd: map[int64]int64{}}
	if a.total > 0 {
		a.insert(0, a.total)
	}
	return a
}

// Total is the managed size in bytes.
func (a *Allocator) Total() int64 { return a.total }

// Used is the allocated size in bytes (rounded sizes).
func (a *Allocator) Used() int64 { return a.used }

// RoundUp is the physical size of an object of n bytes.
func (a *Allocator) RoundUp(n int64) int64 { return roundUp(n, a.align) }

func (a *Allocator) class(size int64) int { return 63 - bits.LeadingZeros64(uint64(size/a.align)) }

func (a *Allocator) insert(start, size int64) {
	a.byStart[start] = size
	a.byEnd[start+size] = start
	c := a.class(size)
	if a.classes[c] == nil {
		a.classes[c] = map[int64]struct{}{}
	}
	a.classes[c][start] = struct{}{}
}

func (a *Allocator) remove(start, size int64) {
	delete(a.byStart, start)
	delete(a.byEnd, start+size)
	delete(a.classes[a.class(size)], start)
}

// Alloc returns the offset of a new extent of RoundUp(size) bytes.
func (a *Allocator) Alloc(size int64) (int64, bool) {
	if size <= 0 {
		return 0, false
	}
	need := a.RoundUp(size)
	if need > a.total-a.used {
		return 0, false
	}
	c := a.class(need)
	// Same class: extents in [2^c, 2^(c+1)) units may or may not fit. The
	// scan stops at an exact fit or after sameClassScan candidates, so a
	// class crowded with slightly-too-small extents cannot make every
	// allocation linear; larger classes always fit.
	start, found := int64(-1), int64(0)
	scanned := 0
	for s := range a.classes[c] {
		if sz := a.byStart[s]; sz >= need {
			start, found = s, sz
			if sz == need {
				break
			}
		}
		if scanned++; scanned >= sameClassScan {
			break
		}
	}
	// Larger classes: any extent fits.
	for cc := c + 1; start < 0 && cc < len(a.classes); cc++ {
		for s := range a.classes[cc] {
			start, found = s, a.byStart[s]
			break
		}
	}
	// Nothing larger is free: finish the scan of a crowded class.
	if start < 0 && scanned >= sameClassScan {
		for s := range a.classes[c] {
			if sz := a.byStart[s]; sz >= need {
				start, found = s, sz
				break
			}
		}
	}
	if start < 0 {
		return 0, false
	}
	a.remove(start, found)
	if found > need {
		a.insert(start+need, found-need)
	}
	a.used += need
	return start, true
}

// AllocBatch allocates every size or nothing: on failure the extents taken
// so far are returned and ok is false.
func (a *Allocator) AllocBatch(sizes []int64) (offs []int64, ok bool) {
	var need int64
	for _, s := range sizes {
		need += a.RoundUp(s)
	}
	if need > a.total-a.used {
		return nil, false
	}
	offs = make([]int64, len(sizes))
	for i, s := range sizes {
		off, ok := a.Alloc(s)
		if !ok {
			for j := 0; j < i; j++ {
				a.Free(offs[j], sizes[j])
			}
			return nil, false
		}
		offs[i] = off
	}
	return offs, true
}

// Free returns an extent obtained from Alloc, coalescing with free
// neighbours.
func (a *Allocator) Free(off, size int64) {
	size = a.RoundUp(size)
	a.used -= size
	if prev, ok := a.byEnd[off]; ok {
		psz := a.byStart[prev]
		a.remove(prev, psz)
		off, size = prev, size+psz
	}
	if nsz, ok := a.byStart[off+size]; ok {
		a.remove(off+size, nsz)
		size += nsz
	}
	a.insert(off, size)
}

// FreeExtents is the number of free extents (a fragmentation measure).
func (a *Allocator) FreeExtents() int { return len(a.byStart) }
