package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Every request decoder must reject bad input with a 400, 413 or 422 and
// never panic; accepted input must satisfy the documented invariants.

func clientErr(t *testing.T, err error) {
	t.Helper()
	switch c := statusOf(err); c {
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge:
	default:
		t.Fatalf("decoder error %v maps to %d", err, c)
	}
}

func FuzzDecodeDeleteObjects(f *testing.F) {
	f.Add([]byte(`{"keys":[{"chunk_hash_hex":"aa","model_name":"m","kv_rank":0,"object_group_id":0,"cache_salt":"user-a"}]}`))
	f.Add([]byte(`{"keys":[],"tier":"all","force":true,"adapter":"s3"}`))
	f.Add([]byte(`{"keys":[{"chunk_hash_hex":"a a","model_name":"m@","kv_rank":-1}]}`))
	f.Add([]byte(`{"keys":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeDeleteObjects(b)
		if err != nil {
			clientErr(t, err)
			return
		}
		if len(req.Keys) > maxDeleteKeys || (req.Tier != "l1" && req.Tier != "l2" && req.Tier != "all") {
			t.Fatalf("accepted %d keys, tier %q", len(req.Keys), req.Tier)
		}
		for i, k := range req.Keys {
			if err := k.Validate(); err != nil {
				t.Fatalf("keys[%d] accepted but invalid: %v", i, err)
			}
		}
	})
}

func FuzzDecodePrefetch(f *testing.F) {
	f.Add([]byte(`{"model_name":"Qwen/Qwen3-8B","world_size":1,"token_ids":[101,102,103],"cache_salt":"user-a"}`))
	f.Add([]byte(`{"model_name":"m","world_size":0}`))
	f.Add([]byte(`{"model_name":"m","world_size":1,"source_tier":"l1","target_tier":"l2"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodePrefetch(b)
		if err != nil {
			clientErr(t, err)
			return
		}
		if req.WorldSize < 1 || len(req.TokenIDs) > maxPrefetchTok {
			t.Fatalf("accepted %+v", req)
		}
	})
}

func FuzzDecodeClear(f *testing.F) {
	f.Add([]byte(``))
	f.Add([]byte(`{"tier":"l1","force":false}`))
	f.Add([]byte(`{"tier":"l2"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tier, _, err := decodeClear(b)
		if err != nil {
			clientErr(t, err)
			return
		}
		if tier != "l1" {
			t.Fatalf("accepted tier %q", tier)
		}
	})
}

func FuzzDecodeChecksums(f *testing.F) {
	f.Add([]byte(`{"block_ids":[0,1,2,3],"chunk_size":2,"instance_id":0,"layerwise":true}`))
	f.Add([]byte(`{"block_ids":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, err := decodeChecksums(b); err != nil {
			clientErr(t, err)
		}
		// blockRanges must accept whatever ids were decoded.
		if req, _, err := decodeChecksums(b); err == nil {
			_ = blockRanges(req.BlockIDs)
		}
	})
}

func FuzzDecodeQuotaPut(f *testing.F) {
	for _, s := range []string{`{"limit_gb":10.0}`, `{"limit_gb":"1e3"}`, `{"limit_gb":true}`, `{"limit_gb":"nan"}`, `{"limit_gb":-1}`, `[]`, `{"limit_gb":1e999}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeQuotaPut(b)
		if err != nil {
			clientErr(t, err)
			return
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("accepted limit_gb %v", v)
		}
	})
}

func FuzzDecodeReconfigure(f *testing.F) {
	f.Add("dax", "add", []byte(`{"device_path":"/dev/dax0.0","size":"100GiB"}`))
	f.Add("dax", "remove", []byte(`{"device_path":"/dev/dax0.0","mode":"drain","force":true,"adapter_index":0}`))
	f.Add("dax", "resize", []byte(`{"device_path":"/dev/dax0.0","size":1024,"mode":"evict"}`))
	f.Add("fs", "flush", []byte(`{"adapter_index":1,"x":[1]}`))
	f.Fuzz(func(t *testing.T, backend, op string, b []byte) {
		req, err := decodeReconfigure(backend, op, b)
		if err != nil {
			clientErr(t, err)
			return
		}
		if _, ok := req.Args["adapter_index"]; ok {
			t.Fatal("adapter_index forwarded to the adapter")
		}
		if backend == "dax" {
			if n, ok := req.Args["size_bytes"]; ok && n.(int64) <= 0 {
				t.Fatalf("accepted size %v", n)
			}
			if _, ok := req.Args["device_path"].(string); !ok {
				t.Fatal("dax call without device_path")
			}
		}
	})
}

func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"1,2,3", "[1, 2, 3]", " 4 5\t6 ", "", "-1", "4294967296", "1,,2", "[1.5]", "[]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		toks, err := parseTokens(s)
		if err != nil {
			clientErr(t, err)
			return
		}
		parts := make([]string, len(toks))
		for i, v := range toks {
			if v < 0 || v > math.MaxUint32 {
				t.Fatalf("token %d out of range", v)
			}
			parts[i] = strconv.FormatInt(v, 10)
		}
		if len(toks) == 0 {
			return
		}
		again, err := parseTokens(strings.Join(parts, ","))
		if err != nil || len(again) != len(toks) {
			t.Fatalf("round trip of %v: %v %v", toks, again, err)
		}
	})
}

func FuzzParseSizeString(f *testing.F) {
	for _, s := range []string{"100GiB", "1.5k", "7", "0", "1 TB", "-1g", "1e3", "9999999999999999999999t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSizeString(s)
		if err != nil {
			clientErr(t, err)
			return
		}
		if n <= 0 {
			t.Fatalf("%q parsed to %d", s, n)
		}
	})
}

func FuzzParseRegisterModel(f *testing.F) {
	f.Add(`{"model_name":"m","world_size":2,"num_layers":32,"hidden_size":1024,"dtype":"torch.bfloat16"}`, 256)
	f.Add(`{"model_name":"m","world_size":1,"object_bytes":4096}`, 16)
	f.Add(`{"model_name":"m","world_size":1,"num_layers":1,"hidden_size":1,"dtype":"fp8","is_mla":true}`, 1)
	f.Fuzz(func(t *testing.T, s string, chunk int) {
		l, err := ParseRegisterModel(s, chunk)
		if err != nil {
			return
		}
		if l.ObjectBytes <= 0 || l.WorldSize < 1 || l.ModelName == "" {
			t.Fatalf("accepted %+v", l)
		}
	})
}
