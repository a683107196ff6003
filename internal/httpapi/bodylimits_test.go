package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestBodyLimitsPerRoute checks each JSON body limit of the MP API on the
// routes that use it: a body one byte over the limit is 413 naming the limit
// and changes nothing, a body of exactly the limit is read and decoded (some
// status other than 413). The 16 MiB limit of /api/kv/retrieve and
// /api/kv/lookup is TestKVJSONBody's; the KV store limit is
// TestKVStoreRetrieveLookup's.
func TestBodyLimitsPerRoute(t *testing.T) {
	e := start(t, envOpts{})
	js := map[string]string{"Content-Type": "application/json"}
	// body returns a JSON object of exactly n bytes: the given fields plus
	// a "pad" string.
	body := func(fields string, n int) string {
		head := `{` + fields + `"pad":"`
		return head + strings.Repeat("x", n-len(head)-2) + `"}`
	}
	const small, large = 1 << 20, 16 << 20
	for _, c := range []struct {
		method, path, fields string
		limit                int
	}{
		{"PUT", "/quota/tenant-a", `"limit_gb":1,`, small},
		{"POST", "/cache/clear", ``, small},
		{"POST", "/reconfigure/dax/add", ``, small},
		{"POST", "/cache/prefetches", ``, large},
		{"DELETE", "/cache/objects", ``, large},
		{"POST", "/cache/checksums", ``, large},
	} {
		over := e.expect(413, c.method, c.path, body(c.fields, c.limit+1), js)
		if want := fmt.Sprintf("request body exceeds %d bytes", c.limit); !strings.Contains(string(over.body), want) {
			t.Errorf("%s %s over the limit: body %s, want it to say %q", c.method, c.path, over.body, want)
		}
		if c.path == "/quota/tenant-a" {
			if m := e.expect(200, "GET", "/quota/tenant-a", nil).json(t); m["exists"] != false {
				t.Fatalf("a refused quota PUT was applied: %v", m)
			}
		}
		if r := e.do(c.method, c.path, body(c.fields, c.limit), js); r.code == 413 {
			t.Errorf("%s %s at exactly the limit: 413 %s", c.method, c.path, r.body)
		}
	}
}

// TestRunScriptSizeLimit checks the 1 MiB cap on an uploaded script: one byte
// over is 413 and runs nothing, exactly 1 MiB runs.
func TestRunScriptSizeLimit(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.RunScriptEnabled = true }})
	const limit = 1 << 20
	src := func(n int) string {
		head := "result = 7\n#"
		return head + strings.Repeat("x", n-len(head))
	}
	b, ct := scriptForm(t, "script", src(limit+1))
	if r := e.expect(413, "POST", "/run_script", b, map[string]string{"Content-Type": ct}); !strings.Contains(string(r.body), fmt.Sprintf("script exceeds %d bytes", limit)) {
		t.Fatalf("over-limit script: %s", r.body)
	}
	b, ct = scriptForm(t, "script", src(limit))
	if r := e.expect(200, "POST", "/run_script", b, map[string]string{"Content-Type": ct}); string(r.body) != "7" {
		t.Fatalf("script of exactly the limit: %q, want \"7\"", r.body)
	}
}
