package objkey

// Encoded is the JSON form of a Key (EncodedObjectKey upstream), used by the
// HTTP API and the coordinator. ObjectGroupID and CacheSalt are optional on
// input for payloads from older servers.
type Encoded struct {
	ChunkHashHex  string `json:"chunk_hash_hex"`
	ModelName     string `json:"model_name"`
	KVRank        int64  `json:"kv_rank"`
	ObjectGroupID int64  `json:"object_group_id"`
	CacheSalt     string `json:"cache_salt"`
}

// Encode returns the JSON form of k.
func (k Key) Encode() Encoded {
	return Encoded{ChunkHashHex: k.HashHex(), ModelName: k.ModelName, KVRank: k.KVRank, ObjectGroupID: k.ObjectGroupID, CacheSalt: k.CacheSalt}
}

// Decode parses the hex hash with Python bytes.fromhex rules and validates
// the resulting key. Unlike upstream it refuses a negative kv_rank: every
// rank a server computes (ComputeKVRank) is >= 0, so a negative one in a
// request names no object and is a client bug, not a miss.
func (e Encoded) Decode() (Key, error) {
	if e.KVRank < 0 {
		return Key{}, invalidf("kv_rank must be >= 0 (got %d)", e.KVRank)
	}
	h, err := FromHex(e.ChunkHashHex)
	if err != nil {
		return Key{}, err
	}
	return New(h, e.ModelName, e.KVRank, e.ObjectGroupID, e.CacheSalt)
}

// FromHex decodes hex the way Python's bytes.fromhex does: pairs of hex
// digits in either case, with ASCII whitespace allowed between pairs (never
// inside one). The empty string decodes to no bytes.
func FromHex(s string) ([]byte, error) {
	out := make([]byte, 0, len(s)/2)
	for i := 0; i < len(s); {
		c := s[i]
		if isPySpace(c) {
			i++
			continue
		}
		if i+1 >= len(s) {
			return nil, invalidf("non-hexadecimal number found in fromhex() arg at position %d", i+1)
		}
		hi, ok1 := unhex(c)
		lo, ok2 := unhex(s[i+1])
		if !ok1 {
			return nil, invalidf("non-hexadecimal number found in fromhex() arg at position %d", i)
		}
		if !ok2 {
			return nil, invalidf("non-hexadecimal number found in fromhex() arg at position %d", i+1)
		}
		out = append(out, hi<<4|lo)
		i += 2
	}
	return out, nil
}

func isPySpace(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
