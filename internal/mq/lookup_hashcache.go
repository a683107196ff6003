package mq

import (
	"hash/maphash"
	"math/rand/v2"
	"sync"

	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// prefixCache remembers the chunk hashes of token prefixes hashed by
// earlier requests, so that a request whose prompt shares a prefix with a
// recent one (the only kind that can hit the cache) does not hash that
// prefix again: blake3 over a 32k-token prompt is about 0.4 ms, walking
// its 128 cached chunks about 20 µs.
//
// It is exact, not probabilistic: an entry is found by its parent's chunk
// hash and a fingerprint of the chunk's token ids, and used only if its
// stored token ids equal the request's; a fingerprint collision is a miss.
// The parent hash chains the entries, so a chunk is reused only behind the
// same prefix, which is what makes its hash the same.
//
// Entries are per cache_salt: the hash does not depend on the salt, but
// sharing entries across salts would let one tenant tell, by how fast its
// LOOKUP is answered, that another sent a prompt recently, which is what
// a salt is there to prevent.
//
// Bounded: two generations of at most half entries each; a full current
// generation becomes the old one and the old one is dropped, and an entry
// found in the old generation moves to the current one (an LRU
// approximation without a list). Each entry owns its token ids (ChunkSize
// uint32s) and hash, so the bound is on memory too.
type prefixCache struct {
	seed     uint64 // fingerprint seed, random per process
	saltSeed maphash.Seed
	half     int // entries per generation; 0 disables the cache

	mu  sync.Mutex
	cur map[chunkID]*chunkNode
	old map[chunkID]*chunkNode
}

// chunkID finds a chunk in the cache.
type chunkID struct {
	parent [32]byte // the previous chunk's hash; zero for the first chunk
	first  bool     // chunk 0, whose parent is the hasher's root
	fp     uint64   // fingerprint of the chunk's token ids
	salt   uint64   // fingerprint of the request's cache_salt
}

// chunkNode is one hashed chunk. Immutable once built, so sessions and
// callers may keep pointers to it after the cache dropped it.
type chunkNode struct {
	id     chunkID
	salt   string   // the cache_salt of the request that hashed it
	tokens []uint32 // the chunk's token ids, owned by this node
	hash   []byte
}

// newPrefixCache holds up to chunks chunks (0 or less: none) of hashes
// made by h; a hasher whose hashes are not 32 bytes long gets no cache.
func newPrefixCache(chunks int, h *tokenhash.Hasher) *prefixCache {
	half := max(chunks/2, 0)
	if h == nil || len(h.ChunkHashesU32(make([]uint32, h.ChunkSize()))[0]) != len(chunkID{}.parent) {
		half = 0
	}
	return &prefixCache{seed: rand.Uint64() | 1, saltSeed: maphash.MakeSeed(), half: half,
		cur: make(map[chunkID]*chunkNode), old: make(map[chunkID]*chunkNode)}
}

// idOf is the cache key of the chunk ids following parent (nil: the root)
// in a request with this cache_salt.
func (c *prefixCache) idOf(parent *chunkNode, salt string, ids []wire.Int) chunkID {
	id := chunkID{first: parent == nil, fp: c.fingerprint(ids), salt: maphash.String(c.saltSeed, salt)}
	if parent != nil {
		copy(id.parent[:], parent.hash) // 32 bytes (newPrefixCache checks)
	}
	return id
}

// fingerprint mixes the token ids in four independent lanes (a chunk of
// 256 ids takes about 70 ns); its quality only decides how often two
// different chunks behind one parent share a map slot, which costs a miss.
func (c *prefixCache) fingerprint(ids []wire.Int) uint64 {
	const m = 0x9e3779b97f4a7c15
	h0, h1, h2, h3 := c.seed, c.seed^0x6a09e667f3bcc908, c.seed^0xbb67ae8584caa73b, c.seed^0x3c6ef372fe94f82b
	i := 0
	for ; i+4 <= len(ids); i += 4 {
		h0 = (h0 ^ uint64(ids[i])) * m
		h1 = (h1 ^ uint64(ids[i+1])) * m
		h2 = (h2 ^ uint64(ids[i+2])) * m
		h3 = (h3 ^ uint64(ids[i+3])) * m
	}
	for ; i < len(ids); i++ {
		h0 = (h0 ^ uint64(ids[i])) * m
	}
	h := h0 ^ (h1 >> 7) ^ (h2 << 11) ^ (h3 >> 19) ^ uint64(len(ids))
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// extend appends to nodes (the chunks of ids already resolved, in order)
// the cached chunks that follow them, and returns it: it stops at the
// first chunk not cached with exactly these token ids and this salt.
func (c *prefixCache) extend(nodes []*chunkNode, salt string, ids []wire.Int, chunk int) []*chunkNode {
	if c.half == 0 {
		return nodes
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(nodes); (i+1)*chunk <= len(ids); i++ {
		var parent *chunkNode
		if i > 0 {
			parent = nodes[i-1]
		}
		part := ids[i*chunk : (i+1)*chunk]
		id := c.idOf(parent, salt, part)
		n := c.cur[id]
		if n == nil {
			if n = c.old[id]; n != nil {
				delete(c.old, id)
				c.putLocked(n)
			}
		}
		if n == nil || n.salt != salt || !sameTokens(n.tokens, part) {
			break
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// add caches nodes[from:], freshly hashed chunks whose ids are set.
func (c *prefixCache) add(nodes []*chunkNode, from int) {
	if c.half == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range nodes[from:] {
		c.putLocked(n)
	}
}

func (c *prefixCache) putLocked(n *chunkNode) {
	if len(c.cur) >= c.half {
		c.old, c.cur = c.cur, make(map[chunkID]*chunkNode, c.half)
	}
	c.cur[n.id] = n
}

// len is the number of cached chunks (both generations).
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}
