package coordinator_test

import (
	"strings"
	"testing"
)

// TestTrailingJSONRefused: a request body with data after its JSON object
// (a stray "]" or "}", which json.Decoder.More does not report) is a 422
// json_invalid, and nothing is registered or applied.
func TestTrailingJSONRefused(t *testing.T) {
	c := startCoord(t, nil)
	for _, body := range []string{
		`{"ip": "127.0.0.1", "http_port": 8080}]`,
		`{"ip": "127.0.0.1", "http_port": 8080}}`,
		`{"ip": "127.0.0.1", "http_port": 8080} {}`,
	} {
		code, raw := c.do("POST", "/instances", body)
		if code != 422 || !strings.Contains(string(raw), `"json_invalid"`) {
			t.Fatalf("POST /instances %s: %d %s, want 422 json_invalid", body, code, raw)
		}
	}
	if n := len(c.must("GET", "/instances", nil, 200)["instances"].([]any)); n != 0 {
		t.Fatalf("%d instances registered from refused bodies, want 0", n)
	}
}
