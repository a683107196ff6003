package objkey

import (
	"encoding/json"
	"testing"
)

// Each fuzz target checks the codec's fixed point: whatever decodes must
// encode to a name that decodes to the same key, and nothing may panic.

func FuzzParseS3Name(f *testing.F) {
	for _, s := range []string{"Qwen/Qwen3-8B@01000100@0@" + goldenHash, "m@-0000001@ff@aa@salt", "m@0x1_0@ 2 @AA bb", "a@b@c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k, err := ParseS3Name(name)
		if err != nil {
			return
		}
		k2, err := ParseS3Name(k.S3Name())
		if err != nil || k2 != k {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", name, k, k.S3Name(), k2, err)
		}
	})
}

func FuzzParseFSName(f *testing.F) {
	for _, s := range []string{"Qwen-SEP-Qwen3-8B@0x01000100@0@" + goldenHash + ".data", "m@-0x0000001@0@@s.data", "x.data", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k, err := ParseFSName(name)
		if err != nil {
			return
		}
		k2, err := ParseFSName(k.FSName())
		if err != nil || k2 != k {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", name, k, k.FSName(), k2, err)
		}
	})
}

func FuzzDecodeJSONKey(f *testing.F) {
	for _, s := range []string{
		`{"chunk_hash_hex":"aa","model_name":"m","kv_rank":1}`,
		`{"chunk_hash_hex":"AA bb","model_name":"m/x","kv_rank":-1,"object_group_id":2,"cache_salt":"s"}`,
		`{"chunk_hash_hex":"a","model_name":"m"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var e Encoded
		if json.Unmarshal(data, &e) != nil {
			return
		}
		k, err := e.Decode()
		if err != nil {
			return
		}
		out, err := json.Marshal(k.Encode())
		if err != nil {
			t.Fatal(err)
		}
		var e2 Encoded
		if err := json.Unmarshal(out, &e2); err != nil {
			t.Fatal(err)
		}
		k2, err := e2.Decode()
		if err != nil || k2 != k {
			t.Fatalf("%s -> %+v -> %s -> %+v, %v", data, k, out, k2, err)
		}
		// Every valid key must also survive both storage-name codecs.
		if k3, err := ParseS3Name(k.S3Name()); err != nil || k3 != k {
			t.Fatalf("S3 round trip of %+v: %+v, %v", k, k3, err)
		}
	})
}
