package httpapi_test

import (
	"fmt"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestJSONTrailingDelimiterRefused: a body whose one JSON value is
// followed by a stray "]" or "}" is malformed JSON, as upstream's
// json.loads says ("Extra data"); json.Decoder.More reports false at a
// closing delimiter, so PUT /quota, POST /reconfigure, KV frame headers and
// --register-model took {"limit_gb": 1}] as one object and applied it. Each
// is now its route's malformed-body status, and nothing is changed.
func TestJSONTrailingDelimiterRefused(t *testing.T) {
	e := start(t, envOpts{})
	for _, body := range []string{`{"limit_gb": 1}]`, `{"limit_gb": 1}}`} {
		if m := e.expect(400, "PUT", "/quota/alice", body).json(t); m["error"] != "invalid JSON body" {
			t.Errorf("PUT /quota %s: %v", body, m)
		}
	}
	if m := e.expect(200, "GET", "/quota/alice", nil).json(t); m["exists"] != false {
		t.Errorf("a refused PUT /quota set a quota: %v", m)
	}
	for _, body := range []string{`{"x": 1}}`, `{"x": 1}]`} {
		e.expect(422, "POST", "/reconfigure/gen/flush", body)
	}
	if c := e.gen.lastCall(); c != nil {
		t.Errorf("a refused reconfigure reached the adapter: %v", c)
	}
	if _, err := httpapi.ParseRegisterModel(registerJSON+"]", testChunk); err == nil {
		t.Error("--register-model with a trailing ']' was accepted")
	}

	// A framed store whose last chunk header ends "}}" stores nothing.
	const n = 2
	toks := tokSlice(900, n*testChunk)
	tensor := kvOne.tensor(n, 5)
	c0, c1 := kvOne.chunkPayload(tensor, n, 0), kvOne.chunkPayload(tensor, n, 1)
	body := kvOne.manifestFrame(toks, n, "", "torch.bfloat16")
	body = append(body, frame("store_chunk", c0, `"chunk_index":0`)...)
	body = append(body, rawFrame([]byte(fmt.Sprintf(`{"version":1,"type":"store_chunk","payload_length":%d,"chunk_index":1}}`, len(c1))), uint64(len(c1)), c1)...)
	if d, _ := e.expect(400, "POST", "/api/kv/store", body, streamCT).json(t)["detail"].(string); d != "invalid KV frame header: trailing data after the JSON value" {
		t.Errorf("framed store: detail %q", d)
	}
	if lk := e.expect(200, "POST", "/api/kv/lookup", map[string]any{"model_name": testModel, "tokens": toks}, jsonCT).json(t); lk["hit_chunks"] != float64(0) {
		t.Errorf("a refused framed store left chunks: %v", lk)
	}
}
