package httpapi_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/httplimit"
)

// TestKVJSONBody: /api/kv/retrieve and /api/kv/lookup take upstream's JSON
// body {model_name, tokens, cache_salt}; it carries token lists far longer
// than the header limit allows, and is validated like the header form.
func TestKVJSONBody(t *testing.T) {
	e := start(t, envOpts{})
	// A JSON body is upstream's form: the answer is the KV_2LTD tensor.
	data := kvOne.tensor(3, 9)
	if m := e.expect(200, "POST", "/api/kv/store", data, upstreamStore(testModel, tokens(0, 3*testChunk), "t1")).json(t); m["stored"] != float64(3) {
		t.Fatalf("store = %v", m)
	}
	js := map[string]string{"Content-Type": "application/json"}
	body := func(v map[string]any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	r := e.expect(200, "POST", "/api/kv/retrieve", body(map[string]any{"model_name": testModel, "tokens": tokSlice(0, 4*testChunk), "cache_salt": "t1"}), js)
	if !bytes.Equal(r.body, data) || r.header.Get(httpapi.HeaderHitChunks) != "3" || r.header.Get(httpapi.HeaderTotalChunks) != "4" {
		t.Fatalf("retrieve by body: %d bytes, headers %v", len(r.body), r.header)
	}
	// 40,000 tokens: about 240 KB as a list, past the 128 KiB header limit.
	long := tokSlice(0, 40_000)
	m := e.expect(200, "POST", "/api/kv/lookup", body(map[string]any{"model_name": testModel, "tokens": long, "cache_salt": "t1"}), js).json(t)
	if m["hit_chunks"] != float64(3) || m["total_chunks"] != float64(40_000/testChunk) {
		t.Fatalf("long lookup = %v", m)
	}
	// The same list does not fit the header form (httplimit answers 431,
	// httplimit.TestHeaderTooLarge).
	var hdr strings.Builder
	for i, v := range long {
		if i > 0 {
			hdr.WriteByte(',')
		}
		hdr.WriteString(strconv.FormatInt(v, 10))
	}
	if hdr.Len() <= httplimit.DefaultMaxHeaderBytes {
		t.Fatalf("a %d-byte header list fits the limit; the test needs a longer one", hdr.Len())
	}

	for _, path := range []string{"/api/kv/retrieve", "/api/kv/lookup"} {
		for b, want := range map[string]string{
			`{"tokens":[1]}`:                            "model_name",
			`{"model_name":"org/model"}`:                "tokens",
			`{"model_name":"org/model","tokens":["a"]}`: "tokens",
			`{"model_name":1,"tokens":[1]}`:             "model_name",
			`[1]`:                                       "body",
			`{"model_name":"org/model","tokens":[1],"world_size":0}`: "world_size",
		} {
			r := e.expect(422, "POST", path, b, js)
			if !strings.Contains(string(r.body), `"`+want+`"`) {
				t.Errorf("%s %s: 422 %s does not name %s", path, b, r.body, want)
			}
		}
		for _, b := range []string{
			`{"model_name":"a@b","tokens":[1]}`,
			`{"model_name":"org/model","tokens":[1],"cache_salt":"bad@salt"}`,
			`{"model_name":"org/model","tokens":[4294967296]}`,
		} {
			e.expect(400, "POST", path, b, js)
		}
		e.expect(413, "POST", path, `{"model_name":"org/model","tokens":[`+strings.Repeat("1,", 9<<20)+`1]}`, js)
	}
}
