// Package objkey defines the identity of one stored KV chunk object (ObjectKey
// upstream), its JSON form, and the two storage-name codecs that L2 backends use
// (S3 object names and filesystem file names). The codecs are byte-identical to
// upstream LMCache so a bucket or directory can be shared with Python servers.
package objkey

import (
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// MaxSaltLen is the longest accepted cache_salt; it keeps FS names under NAME_MAX.
const MaxSaltLen = 128

// ErrInvalid is wrapped by every validation error from this package so callers
// can map it to a 400 without string matching.
var ErrInvalid = errors.New("invalid object key")

// InvalidError is every validation error of this package: Reason is the
// bare rule that failed ("cache_salt exceeds max length 256 (got 300)"),
// what an API message quotes; Error() prefixes ErrInvalid's text.
type InvalidError struct{ Reason string }

func (e *InvalidError) Error() string { return ErrInvalid.Error() + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalidf(format string, args ...any) error {
	return &InvalidError{Reason: fmt.Sprintf(format, args...)}
}

// Reason is the bare rule of an objkey validation error in err's chain,
// or err's text when there is none.
func Reason(err error) string {
	var ie *InvalidError
	if errors.As(err, &ie) {
		return ie.Reason
	}
	return err.Error()
}

// Key identifies one stored chunk object. It is comparable and usable as a map
// key; ChunkHash holds the raw digest bytes (not hex).
type Key struct {
	ChunkHash     string
	ModelName     string
	KVRank        int64
	ObjectGroupID int64
	CacheSalt     string
}

// New builds a validated Key.
func New(chunkHash []byte, modelName string, kvRank, objectGroupID int64, cacheSalt string) (Key, error) {
	k := Key{ChunkHash: string(chunkHash), ModelName: modelName, KVRank: kvRank, ObjectGroupID: objectGroupID, CacheSalt: cacheSalt}
	return k, k.Validate()
}

// badSaltChars are the characters upstream forbids in cache_salt, in the order
// its error message lists them.
const badSaltChars = "@/\\\x00"

// Validate applies upstream's ObjectKey invariants. kv_rank is unchecked
// here, as upstream, so that storage names another server wrote keep
// parsing; keys that arrive in requests (Encoded.Decode) refuse negative
// ranks.
func (k Key) Validate() error {
	if strings.Contains(k.ModelName, "@") {
		return invalidf("model_name must not contain '@' (got '%s')", k.ModelName)
	}
	if k.ObjectGroupID < 0 {
		return invalidf("object_group_id must be >= 0 (got %d)", k.ObjectGroupID)
	}
	return ValidateSalt(k.CacheSalt)
}

// ValidateSalt checks a cache_salt on its own, as the HTTP and wire layers do
// before any key is built.
func ValidateSalt(salt string) error {
	if i := strings.IndexAny(salt, badSaltChars); i >= 0 {
		var bad []string
		for _, c := range badSaltChars {
			if strings.ContainsRune(salt, c) {
				bad = append(bad, fmt.Sprintf("%q", string(c)))
			}
		}
		sort.Strings(bad)
		return invalidf("cache_salt must not contain {%s} (got '%s')", strings.Join(bad, ", "), salt)
	}
	if n := len([]rune(salt)); n > MaxSaltLen {
		return invalidf("cache_salt exceeds max length %d (got %d)", MaxSaltLen, n)
	}
	return nil
}

// HashHex is the lower-case hex of the chunk hash, as upstream's chunk_hash.hex().
func (k Key) HashHex() string { return hex.EncodeToString([]byte(k.ChunkHash)) }

// String is a debugging form; it is the S3 name.
func (k Key) String() string { return k.S3Name() }

// WorldSize returns the world size packed in the top byte of KVRank.
func (k Key) WorldSize() int { return int(k.KVRank >> 24) }

// ComputeKVRank packs a parallel layout into kv_rank exactly as upstream does:
// eight bits per field and no masking, so out-of-range values spill over.
func ComputeKVRank(worldSize, globalRank, localWorldSize, localRank int) int64 {
	return int64(worldSize)<<24 | int64(globalRank)<<16 | int64(localWorldSize)<<8 | int64(localRank)
}

// RankFor is the kv_rank of worker w in a world of size W at every current
// upstream call site: ComputeKVRank(W, w, W, w).
func RankFor(worldSize, worker int) int64 {
	return ComputeKVRank(worldSize, worker, worldSize, worker)
}

// FanOut expands chunk hashes into keys, one slice per object group, each in
// chunk-major, rank-minor order. worker < 0 means every rank 0..worldSize-1
// (lookup semantics); otherwise only that worker's rank is produced (store).
func FanOut(hashes [][]byte, modelName string, worldSize, worker int, groups []int64, cacheSalt string) ([][]Key, error) {
	if len(groups) == 0 {
		groups = []int64{0}
	}
	ranks := []int64{}
	if worker < 0 {
		for r := 0; r < worldSize; r++ {
			ranks = append(ranks, RankFor(worldSize, r))
		}
	} else {
		ranks = append(ranks, RankFor(worldSize, worker))
	}
	// The key fields other than the hash and rank are the same for every
	// key of a group, so one Validate per group checks them all.
	for _, g := range groups {
		if err := (Key{ModelName: modelName, ObjectGroupID: g, CacheSalt: cacheSalt}).Validate(); err != nil {
			return nil, err
		}
	}
	// One string holds every hash and the keys share it: a 32k-token
	// LOOKUP fans out 128 hashes, and a string per hash was an allocation
	// each.
	size := 0
	for _, h := range hashes {
		size += len(h)
	}
	var all strings.Builder
	all.Grow(size)
	for _, h := range hashes {
		all.Write(h)
	}
	joined := all.String()
	out := make([][]Key, len(groups))
	for gi, g := range groups {
		keys := make([]Key, 0, len(hashes)*len(ranks))
		off := 0
		for _, h := range hashes {
			hash := joined[off : off+len(h)]
			off += len(h)
			for _, r := range ranks {
				keys = append(keys, Key{ChunkHash: hash, ModelName: modelName, KVRank: r, ObjectGroupID: g, CacheSalt: cacheSalt})
			}
		}
		out[gi] = keys
	}
	return out, nil
}
