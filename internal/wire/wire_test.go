package wire

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", name+".msgpack"))
	if err != nil {
		t.Fatalf("golden %s: %v (regenerate with /usr/bin/python3 testdata/gen_golden.py)", name, err)
	}
	return b
}

func sameBytes(t *testing.T, name string, got []byte) {
	t.Helper()
	want := golden(t, name)
	if !bytes.Equal(got, want) {
		t.Errorf("%s:\n got %s\nwant %s", name, hex.EncodeToString(got), hex.EncodeToString(want))
	}
}

func ints(v ...int64) []Int {
	out := make([]Int, len(v))
	for i, x := range v {
		out[i] = Int(x)
	}
	return out
}

func TestGoldenScalars(t *testing.T) {
	for name, v := range map[string]int64{
		"uid_0": 0, "uid_70000": 70000, "op_get_chunk_size_gen2m": 17, "op_get_chunk_size_gen3": 21,
		"int_127": 127, "int_128": 128, "int_255": 255, "int_256": 256, "int_65536": 65536,
		"int_2p32": 1 << 32, "int_max63": 1<<63 - 1, "int_neg1": -1, "int_neg33": -33, "int_neg129": -129,
	} {
		sameBytes(t, name, EncodeInt(v))
		var got Int
		if err := Unmarshal(golden(t, name), &got); err != nil || int64(got) != v {
			t.Errorf("%s: decoded %d, %v; want %d", name, got, err, v)
		}
	}
	// An unsigned value above MaxInt64 never wraps to a negative Int.
	for _, name := range []string{"uint_2p63", "uint_max64"} {
		var asInt Int
		if err := Unmarshal(golden(t, name), &asInt); err == nil {
			t.Errorf("%s decoded into Int as %d; want an overflow error", name, asInt)
		}
	}
	sameBytes(t, "nil", Nil)
	sameBytes(t, "true", True)
	sameBytes(t, "false", False)
	sameBytes(t, "str_ok", OK)
	sameBytes(t, "empty_list", EmptyList)
}

func TestGoldenOpFrames(t *testing.T) {
	f, err := DecodeOpFrame(golden(t, "op_name_lookup"))
	if err != nil || !f.IsName || f.Name != "lookup" {
		t.Fatalf("op name frame: %+v %v", f, err)
	}
	if op, ok := f.Resolve(Gen2M); !ok || op != OpLookup {
		t.Errorf("lookup resolved to %v %v", op, ok)
	}
	for name, p := range map[string]*Profile{"op_get_chunk_size_gen2m": Gen2M, "op_get_chunk_size_gen3": Gen3} {
		f, err := DecodeOpFrame(golden(t, name))
		if err != nil || f.IsName {
			t.Fatalf("%s: %+v %v", name, f, err)
		}
		got, ok := ProfileByChunkSizeID(f.ID)
		if !ok || got != p {
			t.Errorf("%s fingerprints as %v, want %s", name, got, p.Name)
		}
		if op, _ := f.Resolve(p); op != OpGetChunkSize {
			t.Errorf("%s resolves to %v", name, op)
		}
	}
	for _, bad := range [][]byte{nil, {0xc0}, {0x01, 0x02}, {0xa3, 'a'}, {0xc4, 0x01, 'x'}} {
		if _, err := DecodeOpFrame(bad); err == nil {
			t.Errorf("DecodeOpFrame(%x) accepted", bad)
		}
	}
}

func TestProfileTables(t *testing.T) {
	cases := []struct {
		p  *Profile
		id int64
		op Op
	}{
		{Gen2M, 3, OpStore}, {Gen2M, 10, OpRegisterEngineDriven}, {Gen2M, 12, OpPrepareStore},
		{Gen2M, 15, OpCommitRetrieve}, {Gen2M, 17, OpGetChunkSize}, {Gen2M, 18, OpPing}, {Gen2M, 20, OpNoop},
		{Gen3, 6, OpStore}, {Gen3, 8, OpLookup}, {Gen3, 10, OpWaitPrefetchStatus}, {Gen3, 13, OpEndSession},
		{Gen3, 14, OpRegisterEngineDriven}, {Gen3, 16, OpPrepareStore}, {Gen3, 19, OpCommitRetrieve},
		{Gen3, 20, OpClear}, {Gen3, 21, OpGetChunkSize}, {Gen3, 22, OpPing}, {Gen3, 24, OpNoop},
		{Gen3, 32, OpGetExperimental}, {Gen3, 34, OpPollKVEvents},
	}
	for _, c := range cases {
		if got, ok := c.p.Op(c.id); !ok || got != c.op {
			t.Errorf("%s %d = %v, want %v", c.p.Name, c.id, got, c.op)
		}
		if id, _ := c.p.ID(c.op); id != c.id {
			t.Errorf("%s ID(%v) = %d, want %d", c.p.Name, c.op, id, c.id)
		}
	}
	if _, ok := Gen3.Op(35); ok {
		t.Error("gen3 35 should be unknown")
	}
	if _, ok := Gen2M.ID(OpWaitPrefetchStatus); ok {
		t.Error("gen2m has no wait_prefetch_status")
	}
	if op, ok := OpByName("REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT"); !ok || op != OpRegisterEngineDriven {
		t.Errorf("enum-style name: %v %v", op, ok)
	}
}

func TestGoldenKeys(t *testing.T) {
	k := Key{ModelName: "m", WorldSize: 1, TokenIDs: ints(1, 2, 3), RequestID: "r", NumKVReaders: 1}
	sameBytes(t, "key_11_fields", Marshal(&k))

	var k8 Key
	if err := Unmarshal(golden(t, "key_8_fields"), &k8); err != nil {
		t.Fatal(err)
	}
	if k8.ModelName != "m" || k8.WorldSize != 1 || k8.WorkerID.Valid || len(k8.TokenIDs) != 3 || k8.RequestID != "r" || k8.Readers() != 1 {
		t.Errorf("8-field key decoded as %+v", k8)
	}

	big := Key{ModelName: "m", WorldSize: 1, WorkerID: SomeInt(1), TokenIDs: ints(0, 127, 128, 255, 256, 65535, 65536, 4294967295),
		End: 8, RequestID: "r", NumKVReaders: 1}
	sameBytes(t, "key_worker_big_tokens", Marshal(&big))
	var back Key
	if err := Unmarshal(golden(t, "key_worker_big_tokens"), &back); err != nil {
		t.Fatal(err)
	}
	if !back.WorkerID.Valid || back.WorkerID.V != 1 || back.TokenIDs[7] != 4294967295 || back.End != 8 {
		t.Errorf("decoded %+v", back)
	}
}

func TestGoldenRegister(t *testing.T) {
	p := RegisterPayload{InstanceID: 4242, ModelName: "meta-llama/Llama-3.1-8B", WorldSize: 2, BlockSize: 16,
		NumLayers: 32, HiddenDimSize: 1024, DtypeStr: "float16",
		NumPhysicalSlots: Nil, EngineGroupInfos: EmptyList, GroupHiddenDimSizes: Nil, GroupLayoutDescs: Nil}
	sameBytes(t, "register_payload", Marshal(&p))

	var hy RegisterPayload
	if err := Unmarshal(golden(t, "register_payload_hybrid"), &hy); err != nil {
		t.Fatal(err)
	}
	if h, why := hy.Hybrid(); !h {
		t.Errorf("hybrid payload not recognised (%s)", why)
	}
	var short RegisterPayload
	if err := Unmarshal(golden(t, "register_payload_8_fields"), &short); err != nil {
		t.Fatal(err)
	}
	if h, _ := short.Hybrid(); h || !short.UseMLA || short.HiddenDimSize != 8 {
		t.Errorf("8-field payload decoded as %+v", short)
	}

	r := RegisterResponse{ShmName: "lmcache_l1_pool_x", PoolSize: 4096, Error: Nil}
	sameBytes(t, "register_response", Marshal(&r))
}

func TestGoldenTransferReplies(t *testing.T) {
	sameBytes(t, "prepare_store_response", EncodeStoreReply(
		[]Slot{{Offset: 4096, Length: 1024, Shape: ints(2, 1, 256, 1), Dtype: "float16"}}, ints(0)))
	sameBytes(t, "prepare_store_response_all_cached", EncodeStoreReply(nil, nil))
	sameBytes(t, "prepare_store_response_all_cached", NegativeReply(OpPrepareStore))
	var refused PrepareStoreResponse
	if err := Unmarshal(golden(t, "prepare_store_response_refused"), &refused); err != nil {
		t.Fatal(err)
	}
	if n, err := MapLen(refused.Context); err != nil || n != 0 {
		t.Errorf("empty context decoded as %d entries, %v", n, err)
	}
	shape := ints(2, 32, 256, 1024)
	sameBytes(t, "prepare_retrieve_response", EncodeRetrieveReply([]Slot{
		{Offset: 0, Length: 32 << 20, Shape: shape, Dtype: "float16"},
		{Offset: 32 << 20, Length: 32 << 20, Shape: shape, Dtype: "float16"}}))
	sameBytes(t, "prepare_retrieve_response_failed", NegativeReply(OpPrepareRetrieve))
	sameBytes(t, "transfer_reply_rejected", NegativeReply(OpStore))
	sameBytes(t, "transfer_reply_rejected", NegativeReply(OpRetrieve))

	var rr PrepareRetrieveResponse
	if err := Unmarshal(golden(t, "prepare_retrieve_response"), &rr); err != nil {
		t.Fatal(err)
	}
	var rc RetrieveContext
	if err := Unmarshal(rr.Context, &rc); err != nil || !rr.Success || len(rc.Slots) != 2 || rc.Slots[1].Offset != 32<<20 {
		t.Errorf("decoded %+v %+v %v", rr, rc, err)
	}
}

func TestGoldenMisc(t *testing.T) {
	var recs []BlockAllocationRecord
	b := golden(t, "block_allocation_records")
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n != 1 {
		t.Fatal(n, err)
	}
	var r BlockAllocationRecord
	if _, err := r.UnmarshalMsg(b); err != nil {
		t.Fatal(err)
	}
	recs = append(recs, r)
	if recs[0].ReqID != "r" || len(recs[0].NewBlockIDs) != 2 || recs[0].NewTokenIDs[0] != 300 {
		t.Errorf("decoded %+v", recs)
	}
	sameBytes(t, "session_end_info", Marshal(&SessionEndInfo{FinishReason: "stop", StopTokenID: -1}))
}

func TestNullChunkMask(t *testing.T) {
	k := Key{NullChunkMask: msgp.Raw{0x91, 0x92, 0xc3, 0xc2}}
	m, err := k.NullChunks()
	if err != nil || len(m) != 1 || len(m[0]) != 2 || !m[0][0] || m[0][1] {
		t.Errorf("got %v %v", m, err)
	}
	k.NullChunkMask = msgp.Raw{0x91, 0x91, 0x01}
	if _, err := k.NullChunks(); err == nil {
		t.Error("int in mask accepted")
	}
}

func TestObjectLayout(t *testing.T) {
	// research datapath.md 7.2: 32 layers x 1024 hidden, fp16, chunk 256.
	item, ok := DtypeSize("float16")
	if !ok || ObjectBytes(ObjectShape(32, 256, 1024, false), item) != 32<<20 {
		t.Errorf("KV_2LTD object: item %d %v, %d bytes", item, ok, ObjectBytes(ObjectShape(32, 256, 1024, false), item))
	}
	if got := ObjectShape(32, 256, 576, true); len(got) != 3 || got[0] != 32 || got[1] != 256 || got[2] != 576 {
		t.Errorf("MLA shape %v", got)
	}
	if _, ok := DtypeSize("complex64"); ok {
		t.Error("complex64 has a size")
	}
	if got := ChunkObjectBytes(32, 256, 1024, false, 2); got != 32<<20 {
		t.Errorf("ChunkObjectBytes KV_2LTD = %d", got)
	}
	if got := ChunkObjectBytes(61, 64, 576, true, 1); got != 61*64*576 {
		t.Errorf("ChunkObjectBytes MLA = %d", got)
	}
}

// TestIntFastPaths: the hand-written fast forms of Int encode and decode
// exactly as msgp's general ones, at every size boundary, and a truncated
// frame is an error, never a value.
func TestIntFastPaths(t *testing.T) {
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1, -1, -32, -33, -128, -129, -1 << 63} {
		want := msgp.AppendInt64(nil, v)
		if v >= 0 {
			want = msgp.AppendUint64(nil, uint64(v))
		}
		got := AppendInt(nil, v)
		if !bytes.Equal(got, want) {
			t.Errorf("AppendInt(%d) = %x, want %x", v, got, want)
		}
		// Decode with trailing bytes (the fast paths need 5 bytes of input).
		var i Int
		rest, err := i.UnmarshalMsg(append(got, 0xc0, 0xc0, 0xc0, 0xc0))
		if err != nil || int64(i) != v || len(rest) != 4 {
			t.Errorf("decode %x = %d, %d left, %v", got, i, len(rest), err)
		}
		if len(got) > 1 {
			if _, err := i.UnmarshalMsg(got[:len(got)-1]); err == nil {
				t.Errorf("truncated %x decoded", got[:len(got)-1])
			}
		}
	}
	var i Int
	if _, err := i.UnmarshalMsg([]byte{0xa1, 'x', 0, 0, 0}); err == nil {
		t.Error("a str decoded as Int")
	}
}

// TestPingReplies: PING answers in the type each generation declares.
func TestPingReplies(t *testing.T) {
	const token = 1 << 40
	if b := EncodePing(Gen2M.Ping, false, token); !bytes.Equal(b, True) {
		t.Errorf("gen2m untracked = %x", b)
	}
	if b := EncodePing(Gen2M.Ping, true, token); !bytes.Equal(b, True) {
		t.Errorf("gen2m tracked = %x", b)
	}
	if b := EncodePing(Gen3.Ping, true, token); !bytes.Equal(b, EncodeInt(token)) {
		t.Errorf("gen3 tracked = %x", b)
	}
	if b := EncodePing(Gen3.Ping, false, token); !bytes.Equal(b, []byte{0x02}) {
		t.Errorf("gen3 untracked = %x", b)
	}
	if o := Gen3.Others(); len(o) != 1 || o[0] != Gen2M {
		t.Errorf("Gen3.Others() = %v", o)
	}
}
