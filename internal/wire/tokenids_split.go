package wire

import (
	"encoding/binary"
	"math"
	"sync"
)

// The token array decode is a chain: where an id starts depends on the
// length of the id before it, so one loop runs at the latency of two
// dependent loads per id (about 3 ns), not at the CPU's throughput. A
// 32k-token key is 32k ids on every LOOKUP. decodeSplit runs two chains
// in one loop so that the CPU overlaps them: the first from the start of
// the array, the second from a guessed byte offset in its middle.
//
// The guess need not be an id boundary. A chain started inside an id reads
// payload bytes as tags and soon lands on a real boundary (ids are 1 to 5
// bytes), and from then on both chains visit the same positions, because
// where the next id starts is a function of where this one starts. So once
// the first chain, past the middle, stands on a position the second one
// visited, everything the second decoded from there is exact. If they
// never meet, or the second read anything but the fast forms after the
// meeting point, its work is dropped and the plain loop goes on.

// splitMin is the smallest array decodeSplit is used for: below it the
// plain loop's time is small, and the warm-up below is most of the array.
const splitMin = 4096

// splitWarm ids are decoded by the first chain alone, to estimate the mean
// id length and so the byte offset of the middle id.
const splitWarm = 256

// splitScratch holds the second chain's ids and positions.
type splitScratch struct {
	ids []Int
	pos []int32
}

var splitScratchPool = sync.Pool{New: func() any { return new(splitScratch) }}

// decodeSplit decodes a prefix of ids from rest (the array's bytes after
// its header) with two chains and returns how many ids it decoded, exactly,
// and the byte offset after the last one; the caller decodes the rest.
// It decodes only the fast forms (decLen) and never reads past rest.
func decodeSplit(rest []byte, ids []Int) (done, pos int) {
	n := len(ids)
	limit := len(rest) - 8 // a chain reads one 8-byte word at its position
	if n < splitMin || limit < 0 || len(rest) > math.MaxInt32 {
		return 0, 0 // (positions are kept as int32)
	}
	pA := 0
	for i := range splitWarm {
		if pA > limit || decLen[rest[pA]] == 0 {
			return i, pA
		}
		c := rest[pA]
		ids[i] = Int(binary.BigEndian.Uint64(rest[pA:]) >> decShift[c] & decMask[c])
		pA += int(decLen[c])
	}
	half := n / 2
	pB := pA + (half-splitWarm)*pA/splitWarm // the middle id's guessed offset
	steps := n - half - splitWarm            // ids the second chain decodes
	if pB > limit {
		return splitWarm, pA
	}
	sc := splitScratchPool.Get().(*splitScratch)
	defer splitScratchPool.Put(sc)
	if cap(sc.ids) < steps {
		sc.ids, sc.pos = make([]Int, steps), make([]int32, steps)
	}
	bIDs, bPos := sc.ids[:steps], sc.pos[:steps]
	// The second chain steps over a byte that is not a fast form by one
	// byte. Such steps happen while it has not met a boundary yet (in its
	// first few ids) and past the array's end. bad lists the first of
	// their indices; from overflow on, every index counts as one.
	var bad [64]int
	nBad, overflow, k := 0, steps, 0
	i := splitWarm
	for ; i < half && k < steps && pA <= limit && pB <= limit; i, k = i+1, k+1 {
		cA, cB := rest[pA], rest[pB]
		if decLen[cA] == 0 {
			break
		}
		wA := binary.BigEndian.Uint64(rest[pA:])
		wB := binary.BigEndian.Uint64(rest[pB:])
		ids[i] = Int(wA >> decShift[cA] & decMask[cA])
		bIDs[k], bPos[k] = Int(wB>>decShift[cB]&decMask[cB]), int32(pB)
		pA += int(decLen[cA])
		if l := int(decLen[cB]); l != 0 {
			pB += l
			continue
		}
		pB++
		if nBad < len(bad) {
			bad[nBad], nBad = k, nBad+1
		} else if overflow == steps {
			overflow = k
		}
	}
	if k == 0 {
		return i, pA
	}
	// The first chain goes on alone (the second one may have reached the
	// buffer's end first) up to the second one's first position; it
	// stops at anything but a fast form, which the plain loop decodes.
	for pA < int(bPos[0]) && i < n {
		if pA > limit || decLen[rest[pA]] == 0 {
			return i, pA
		}
		c := rest[pA]
		ids[i] = Int(binary.BigEndian.Uint64(rest[pA:]) >> decShift[c] & decMask[c])
		pA += int(decLen[c])
		i++
	}
	// Find the meeting point: the second chain's positions increase.
	j := 0
	for j < k && int(bPos[j]) < pA {
		j++
	}
	if j == k || int(bPos[j]) != pA {
		return i, pA
	}
	firstBad := overflow
	for _, x := range bad[:nBad] {
		if x >= j && x < firstBad {
			firstBad = x
		}
	}
	take := min(k-j, n-i, firstBad-j)
	copy(ids[i:], bIDs[j:j+take])
	i += take
	if j+take < k {
		pA = int(bPos[j+take])
	} else {
		pA = pB
	}
	return i, pA
}
