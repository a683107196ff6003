package objkey

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const goldenHash = "9f2c6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368be1"

// Golden names were produced with Python's own formatting rules
// (f"{r:08x}" for S3, f"{r:#010x}" for FS), as upstream writes them.
func TestStorageNamesGolden(t *testing.T) {
	h := mustHex(t, goldenHash)
	cases := []struct {
		key    Key
		s3, fs string
	}{
		{Key{string(h), "Qwen/Qwen3-8B", 16777472, 0, ""},
			"Qwen/Qwen3-8B@01000100@0@" + goldenHash,
			"Qwen-SEP-Qwen3-8B@0x01000100@0@" + goldenHash + ".data"},
		{Key{string(h), "Qwen/Qwen3-8B", 16777472, 0, "user-a"},
			"Qwen/Qwen3-8B@01000100@0@" + goldenHash + "@user-a",
			"Qwen-SEP-Qwen3-8B@0x01000100@0@" + goldenHash + "@user-a.data"},
		{Key{string(h[:2]), "m", 33620481, 255, ""},
			"m@02010201@ff@9f2c", "m@0x02010201@ff@9f2c.data"},
		{Key{"", "org/a/b", -1, 0, "s"},
			"org/a/b@-0000001@0@@s", "org-SEP-a-SEP-b@-0x0000001@0@@s.data"},
		{Key{"\x01", "m", 1 << 40, 16, ""},
			"m@10000000000@10@01", "m@0x10000000000@10@01.data"},
	}
	for _, c := range cases {
		if got := c.key.S3Name(); got != c.s3 {
			t.Errorf("S3Name = %q, want %q", got, c.s3)
		}
		if got := c.key.FSName(); got != c.fs {
			t.Errorf("FSName = %q, want %q", got, c.fs)
		}
		if k, err := ParseS3Name(c.s3); err != nil || k != c.key {
			t.Errorf("ParseS3Name(%q) = %+v, %v; want %+v", c.s3, k, err, c.key)
		}
		if k, err := ParseFSName(c.fs); err != nil || k != c.key {
			t.Errorf("ParseFSName(%q) = %+v, %v; want %+v", c.fs, k, err, c.key)
		}
	}
}

func TestParseNamesLikePython(t *testing.T) {
	// int(x, 16) accepts a 0x prefix, a sign, underscores and spaces;
	// bytes.fromhex accepts whitespace between pairs and upper case.
	k, err := ParseS3Name("m@0x1_0@ 2 @AA bb")
	if err != nil {
		t.Fatal(err)
	}
	want := Key{"\xaa\xbb", "m", 16, 2, ""}
	if k != want {
		t.Fatalf("got %+v, want %+v", k, want)
	}
	for _, bad := range []string{
		"m@1@0",                    // too few fields
		"m@1@0@aa@s@x",             // too many
		"m@zz@0@aa",                // bad rank
		"m@1@-1@aa",                // negative group
		"m@1@0@abc",                // odd hex
		"m@1@0@aa@bad/salt",        // bad salt
		"m@1@0@a a",                // whitespace inside a pair
		"m@1__0@0@aa",              // double underscore
		"m@_1@0@aa",                // leading underscore
		"m@10000000000000000@0@aa", // overflows int64
	} {
		if _, err := ParseS3Name(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseS3Name(%q) err = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := ParseFSName("m@0x1@0@aa"); !errors.Is(err, ErrInvalid) {
		t.Errorf("FS name without .data accepted: %v", err)
	}
}

func TestValidateMessages(t *testing.T) {
	cases := []struct {
		key  Key
		want string
	}{
		{Key{ModelName: "a@b"}, "model_name must not contain '@' (got 'a@b')"},
		{Key{ModelName: "m", ObjectGroupID: -3}, "object_group_id must be >= 0 (got -3)"},
		{Key{ModelName: "m", CacheSalt: "a/b"}, `cache_salt must not contain {"/"} (got 'a/b')`},
		{Key{ModelName: "m", CacheSalt: "a@\x00"}, `cache_salt must not contain {"@", "\x00"} (got 'a@` + "\x00" + `')`},
		{Key{ModelName: "m", CacheSalt: strings.Repeat("x", 129)}, "cache_salt exceeds max length 128 (got 129)"},
	}
	for _, c := range cases {
		err := c.key.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.key, err, c.want)
		}
	}
	if err := (Key{ModelName: "m", CacheSalt: strings.Repeat("é", 128), KVRank: -5}).Validate(); err != nil {
		t.Errorf("128-rune salt and a negative kv_rank (storage names) must be valid: %v", err)
	}
}

// TestNegativeKVRankRefused: kv_rank -1 in the JSON key form is refused with
// a clear error naming the field, and builds no key.
func TestNegativeKVRankRefused(t *testing.T) {
	var e Encoded
	if err := json.Unmarshal([]byte(`{"chunk_hash_hex":"aa01","model_name":"m","kv_rank":-1}`), &e); err != nil {
		t.Fatal(err)
	}
	k, err := e.Decode()
	if !errors.Is(err, ErrInvalid) || err.Error() != "invalid object key: kv_rank must be >= 0 (got -1)" {
		t.Fatalf("Decode kv_rank -1: key %+v, err %v", k, err)
	}
	if _, err := New([]byte{1}, "m", 0, 0, ""); err != nil {
		t.Fatalf("kv_rank 0 refused: %v", err)
	}
}

func TestKVRank(t *testing.T) {
	cases := []struct {
		w, r int
		want int64
	}{{1, 0, 16777472}, {2, 0, 33554944}, {2, 1, 33620481}, {4, 0, 67109888}, {4, 1, 67175425}, {4, 2, 67240962}, {4, 3, 67306499}}
	for _, c := range cases {
		if got := RankFor(c.w, c.r); got != c.want {
			t.Errorf("RankFor(%d,%d) = %d, want %d", c.w, c.r, got, c.want)
		}
	}
	if got := (Key{KVRank: RankFor(4, 3)}).WorldSize(); got != 4 {
		t.Errorf("WorldSize = %d, want 4", got)
	}
}

func TestFanOutOrder(t *testing.T) {
	hashes := [][]byte{{1}, {2}}
	groups, err := FanOut(hashes, "m", 2, -1, []int64{0, 3}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 {
		t.Fatalf("got %d groups", len(groups))
	}
	want := []Key{
		{"\x01", "m", 33554944, 3, "alice"},
		{"\x01", "m", 33620481, 3, "alice"},
		{"\x02", "m", 33554944, 3, "alice"},
		{"\x02", "m", 33620481, 3, "alice"},
	}
	for i, k := range groups[1] {
		if k != want[i] {
			t.Errorf("group 3 key %d = %+v, want %+v", i, k, want[i])
		}
	}
	one, err := FanOut(hashes, "m", 2, 1, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || len(one[0]) != 2 || one[0][0].KVRank != 33620481 || one[0][1].ChunkHash != "\x02" {
		t.Errorf("single-worker fan-out = %+v", one)
	}
	if _, err := FanOut(hashes, "m@x", 1, -1, nil, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("FanOut with bad model: %v", err)
	}
}

// TestFanOutSharesHashes checks the 128-hash fan-out of a 32k-token LOOKUP
// (world size 2): every key carries its own chunk's hash, the caller's
// hash slices may be reused afterwards, a bad salt or group is refused,
// and the whole fan-out costs a fixed number of allocations, not one per
// hash.
func TestFanOutSharesHashes(t *testing.T) {
	hashes := make([][]byte, 128)
	for i := range hashes {
		hashes[i] = bytes.Repeat([]byte{byte(i)}, 32)
	}
	groups, err := FanOut(hashes, "m", 2, -1, nil, "s")
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 1 || len(groups[0]) != 256 {
		t.Fatalf("fan-out shape %d groups, %d keys", len(groups), len(groups[0]))
	}
	for i := range hashes {
		hashes[i][0] = 0xff // the keys must not alias the caller's bytes
	}
	for i, k := range groups[0] {
		want := Key{ChunkHash: string(bytes.Repeat([]byte{byte(i / 2)}, 32)), ModelName: "m", KVRank: RankFor(2, i%2), CacheSalt: "s"}
		if k != want {
			t.Fatalf("key %d = %+v, want %+v", i, k, want)
		}
	}
	if _, err := FanOut(hashes, "m", 1, -1, nil, "a/b"); !errors.Is(err, ErrInvalid) {
		t.Errorf("FanOut with bad salt: %v", err)
	}
	if _, err := FanOut(hashes, "m", 1, -1, []int64{0, -1}, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("FanOut with a negative group: %v", err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := FanOut(hashes, "m", 2, -1, nil, "s"); err != nil {
			t.Fatal(err)
		}
	})
	// ranks, the joined hashes, the group list, the group's keys and the
	// default groups: 5, whatever the number of hashes.
	if allocs > 5 {
		t.Errorf("FanOut of 128 hashes: %v allocations, want at most 5", allocs)
	}
}

func TestEncodedJSON(t *testing.T) {
	var e Encoded
	if err := json.Unmarshal([]byte(`{"chunk_hash_hex":"AA01","model_name":"m","kv_rank":16777472}`), &e); err != nil {
		t.Fatal(err)
	}
	k, err := e.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if k != (Key{"\xaa\x01", "m", 16777472, 0, ""}) {
		t.Fatalf("decoded %+v", k)
	}
	out, _ := json.Marshal(k.Encode())
	const want = `{"chunk_hash_hex":"aa01","model_name":"m","kv_rank":16777472,"object_group_id":0,"cache_salt":""}`
	if string(out) != want {
		t.Errorf("encode = %s, want %s", out, want)
	}
	if _, err := (Encoded{ChunkHashHex: "zz", ModelName: "m"}).Decode(); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad hex: %v", err)
	}
}

// TestInvalidErrorReason: validation errors are *InvalidError, wrap
// ErrInvalid, and Reason gives the bare rule an API message quotes, with
// no trimming of error text.
func TestInvalidErrorReason(t *testing.T) {
	err := ValidateSalt("a/b")
	var ie *InvalidError
	if !errors.As(err, &ie) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %#v", err)
	}
	if got := Reason(fmt.Errorf("wrapped: %w", err)); got != ie.Reason || got != `cache_salt must not contain {"/"} (got 'a/b')` {
		t.Fatalf("Reason = %q", got)
	}
	if err.Error() != "invalid object key: "+ie.Reason {
		t.Fatalf("Error() = %q", err.Error())
	}
	if got := Reason(errors.New("other")); got != "other" {
		t.Fatalf("Reason(other) = %q", got)
	}
}
