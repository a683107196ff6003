// Package tokenhash turns token ids into prefix-chained chunk hashes, the
// chunk_hash of every object key. It matches upstream's TokenHasher so that a
// Go server, a Go coordinator and Python servers derive the same keys.
//
// Each full chunk i is hashed as H(h_{i-1}, tokens[i*C:(i+1)*C]) with h_{-1}
// the root ("none hash"); a partial tail chunk yields nothing.
package tokenhash

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/fxamacker/cbor/v2"
	"github.com/zeebo/blake3"
)

// Algorithm names accepted by New, as upstream's --hash-algorithm.
const (
	Blake3     = "blake3"
	SHA256CBOR = "sha256_cbor"
	// SHA256CBOR64 is the pre-rename vLLM name; upstream maps it to sha256_cbor.
	SHA256CBOR64 = "sha256_cbor_64bit"
)

// ErrTokenRange is returned for a token id that does not fit in uint32.
var ErrTokenRange = errors.New("token id out of uint32 range")

// ErrAlgorithm is returned for an algorithm this implementation cannot
// reproduce bit-exactly (for example Python's builtin hash).
var ErrAlgorithm = errors.New("unsupported hash algorithm")

// Hasher computes chunk hashes. It is immutable and safe for concurrent use.
type Hasher struct {
	algo      string
	chunkSize int
	root      []byte
}

// Option adjusts a Hasher.
type Option func(*Hasher)

// WithRoot overrides the root (none hash), for matching a server whose root
// differs from the fallback upstream computes without vLLM.
func WithRoot(root []byte) Option {
	return func(h *Hasher) { h.root = append([]byte(nil), root...) }
}

// New returns a Hasher for algo with the given chunk size.
func New(algo string, chunkSize int, opts ...Option) (*Hasher, error) {
	if chunkSize < 1 {
		return nil, fmt.Errorf("chunk size must be >= 1 (got %d)", chunkSize)
	}
	switch algo {
	case Blake3:
	case SHA256CBOR, SHA256CBOR64:
		algo = SHA256CBOR
	default:
		return nil, fmt.Errorf("%w %q: supported are %q and %q", ErrAlgorithm, algo, Blake3, SHA256CBOR)
	}
	h := &Hasher{algo: algo, chunkSize: chunkSize}
	for _, o := range opts {
		o(h)
	}
	if h.root == nil {
		h.root = DefaultRoot(algo)
	}
	return h, nil
}

// Algorithm returns the canonical algorithm name.
func (h *Hasher) Algorithm() string { return h.algo }

// ChunkSize returns the tokens per chunk.
func (h *Hasher) ChunkSize() int { return h.chunkSize }

// Root returns a copy of the root hash.
func (h *Hasher) Root() []byte { return append([]byte(nil), h.root...) }

// DefaultRoot is upstream's fallback none hash: H(0, [0]) with the int prefix
// 0 serialized as the algorithm serializes ints.
func DefaultRoot(algo string) []byte {
	switch algo {
	case SHA256CBOR, SHA256CBOR64:
		return sha256CBOR(int64(0), []uint32{0})
	default:
		var zero [12]byte // 8-byte signed int 0, then token 0 as uint32
		sum := blake3.Sum256(zero[:])
		return sum[:]
	}
}

// ToUint32 validates token ids and narrows them.
func ToUint32(tokens []int64) ([]uint32, error) {
	out := make([]uint32, len(tokens))
	for i, t := range tokens {
		if t < 0 || t > math.MaxUint32 {
			return nil, fmt.Errorf("%w: token_ids[%d]=%d", ErrTokenRange, i, t)
		}
		out[i] = uint32(t)
	}
	return out, nil
}

// ChunkHashes validates tokens and hashes every full chunk.
func (h *Hasher) ChunkHashes(tokens []int64) ([][]byte, error) {
	u, err := ToUint32(tokens)
	if err != nil {
		return nil, err
	}
	return h.ChunkHashesU32(u), nil
}

// NumChunks is how many full chunks n tokens make.
func (h *Hasher) NumChunks(n int) int { return n / h.chunkSize }

// ChunkHashesU32 hashes every full chunk of already-valid token ids.
func (h *Hasher) ChunkHashesU32(tokens []uint32) [][]byte {
	n := h.NumChunks(len(tokens))
	out := make([][]byte, 0, n)
	prefix := h.root
	if h.algo == SHA256CBOR {
		for i := 0; i < n; i++ {
			prefix = sha256CBOR(prefix, tokens[i*h.chunkSize:(i+1)*h.chunkSize])
			out = append(out, prefix)
		}
		return out
	}
	buf := make([]byte, 4*h.chunkSize)
	digests := make([]byte, 32*n) // one allocation for all results
	hasher := blake3.New()
	for i := 0; i < n; i++ {
		for j, t := range tokens[i*h.chunkSize : (i+1)*h.chunkSize] {
			binary.BigEndian.PutUint32(buf[4*j:], t)
		}
		hasher.Reset()
		_, _ = hasher.Write(prefix)
		_, _ = hasher.Write(buf)
		d := hasher.Sum(digests[32*i : 32*i : 32*(i+1)])
		out = append(out, d)
		prefix = d
	}
	return out
}

var cborEnc = func() cbor.EncMode {
	m, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	return m
}()

// sha256CBOR is vLLM's sha256_cbor over the tuple (prefix, tokens, None),
// encoded as canonical CBOR the way Python's cbor2 encodes it.
func sha256CBOR(prefix any, tokens []uint32) []byte {
	b, err := cborEnc.Marshal([]any{prefix, tokens, nil})
	if err != nil {
		// Only bytes, ints, uint32 slices and nil reach here; all encode.
		panic(fmt.Sprintf("tokenhash: cbor encode: %v", err))
	}
	sum := sha256.Sum256(b)
	return sum[:]
}
