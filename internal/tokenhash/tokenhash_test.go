package tokenhash

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/zeebo/blake3"
)

func seq(from, to int64) []int64 {
	out := make([]int64, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func hexes(hs [][]byte) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = hex.EncodeToString(h)
	}
	return out
}

// Vectors from ../shared/research/coordinator.md section 7.4 (blake3).
func TestBlake3Golden(t *testing.T) {
	if got := hex.EncodeToString(DefaultRoot(Blake3)); got != "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b" {
		t.Fatalf("root = %s", got)
	}
	cases := []struct {
		tokens []int64
		chunk  int
		want   []string
	}{
		{seq(1, 10), 4, []string{
			"6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368b71123c",
			"98efc76eafb06cfe774c31ff151f300b61a614c27982a211bb8cdbd83a8c0e19",
		}},
		{seq(0, 512), 256, []string{
			"084547b6c40ed5b05ba8cd0305db5bf74d5617673948d9ed193ab7d6cbc484d4",
			"e5ffee45c2b9db326814c9692dc594369887ba3b0df5761817820b60f864c8e0",
		}},
		{seq(0, 255), 256, []string{}},
		{nil, 256, []string{}},
	}
	for _, c := range cases {
		h, err := New(Blake3, c.chunk)
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.ChunkHashes(c.tokens)
		if err != nil {
			t.Fatal(err)
		}
		gs := hexes(got)
		if len(gs) != len(c.want) {
			t.Fatalf("chunk %d, %d tokens: %d hashes, want %d", c.chunk, len(c.tokens), len(gs), len(c.want))
		}
		for i := range gs {
			if gs[i] != c.want[i] {
				t.Errorf("chunk %d hash %d = %s, want %s", c.chunk, i, gs[i], c.want[i])
			}
		}
	}
}

// sha256_cbor vectors were computed with hashlib over CBOR bytes assembled by
// hand (array(3) [bstr prefix, array of uints, null]), independent of the
// CBOR library used here.
func TestSHA256CBORGolden(t *testing.T) {
	if got := hex.EncodeToString(DefaultRoot(SHA256CBOR)); got != "d01eddc504e77448195ff488ddf8bfb601ebd9c229db2d8e38cb08cdc3d3c8a1" {
		t.Fatalf("root = %s", got)
	}
	cases := []struct {
		tokens []int64
		chunk  int
		want   []string
	}{
		{seq(1, 9), 4, []string{
			"08f15010d8f0a9fd58a062989fb2e80a4bf7003a7fd100adc7b6b7c85d5113f0",
			"f6b5d04f80289bf1f109a34d7286357e961cfaa8a950dd621081f24aa658b262",
		}},
		{seq(0, 512), 256, []string{
			"b0132f46964931ab608cc8c285fe9532034c701c9f2bb68eaab3ee0dcd08841a",
			"334d7ee027da021f3ed0f93c3343550187dbb82d500b44ca8ebccebe52cdb0ff",
		}},
		{[]int64{70000, 4294967295, 23, 24}, 4, []string{
			"68b12fd07ec2dcee280675ebc005115e821413b185fdcf317a3b3a252cedde81",
		}},
	}
	for _, c := range cases {
		h, err := New(SHA256CBOR64, c.chunk)
		if err != nil {
			t.Fatal(err)
		}
		if h.Algorithm() != SHA256CBOR {
			t.Errorf("alias not canonicalized: %s", h.Algorithm())
		}
		got, err := h.ChunkHashes(c.tokens)
		if err != nil {
			t.Fatal(err)
		}
		gs := hexes(got)
		for i := range c.want {
			if i >= len(gs) || gs[i] != c.want[i] {
				t.Errorf("hash %d = %v, want %s", i, gs, c.want[i])
			}
		}
	}
}

func TestRootOverrideAndErrors(t *testing.T) {
	root := make([]byte, 32)
	h, err := New(Blake3, 2, WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	got := h.ChunkHashesU32([]uint32{7, 9})
	// Root of 32 zero bytes, then tokens 7 and 9 big-endian.
	want := blake3.Sum256(append(make([]byte, 32), 0, 0, 0, 7, 0, 0, 0, 9))
	if hex.EncodeToString(got[0]) != hex.EncodeToString(want[:]) {
		t.Errorf("override root: got %x want %x", got[0], want)
	}
	if _, err := h.ChunkHashes([]int64{1, -1}); !errors.Is(err, ErrTokenRange) {
		t.Errorf("negative token: %v", err)
	}
	if _, err := h.ChunkHashes([]int64{1 << 32, 0}); !errors.Is(err, ErrTokenRange) {
		t.Errorf("token 2^32: %v", err)
	}
	if _, err := New("builtin", 256); !errors.Is(err, ErrAlgorithm) {
		t.Errorf("builtin: %v", err)
	}
	if _, err := New(Blake3, 0); err == nil {
		t.Error("chunk size 0 accepted")
	}
}

// Results must not alias each other: callers keep them as map keys.
func TestResultsIndependent(t *testing.T) {
	h, _ := New(Blake3, 1)
	hs := h.ChunkHashesU32([]uint32{1, 2, 3})
	if string(hs[0]) == string(hs[1]) || len(hs[2]) != 32 || cap(hs[0]) != 32 {
		t.Fatalf("aliased results: %x", hs)
	}
}

const benchTokens = 32 * 1024

func benchInput() []uint32 {
	t := make([]uint32, benchTokens)
	for i := range t {
		t[i] = uint32(i * 7919)
	}
	return t
}

// BenchmarkChunkHashes32k hashes a 32k-token prompt; compare its ns/token
// with BenchmarkBlake3Ceiling, raw BLAKE3 over the same bytes.
func BenchmarkChunkHashes32k(b *testing.B) {
	h, _ := New(Blake3, 256)
	toks := benchInput()
	b.SetBytes(benchTokens * 4)
	b.ReportAllocs()
	for b.Loop() {
		h.ChunkHashesU32(toks)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchTokens, "ns/token")
}

// BenchmarkBlake3Ceiling hashes the same 128 KiB of token bytes (plus the
// 32-byte prefixes) with raw BLAKE3 in the same 1 KiB pieces: the ceiling.
func BenchmarkBlake3Ceiling(b *testing.B) {
	buf := make([]byte, 32+256*4)
	b.SetBytes(benchTokens * 4)
	for b.Loop() {
		for i := 0; i < benchTokens/256; i++ {
			blake3.Sum256(buf)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchTokens, "ns/token")
}

func BenchmarkSHA256CBOR32k(b *testing.B) {
	h, _ := New(SHA256CBOR, 256)
	toks := benchInput()
	b.SetBytes(benchTokens * 4)
	for b.Loop() {
		h.ChunkHashesU32(toks)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchTokens, "ns/token")
}
