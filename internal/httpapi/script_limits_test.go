package httpapi_test

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestRunScriptMemoryLimit: [0]*1000000000 (one 16 GB allocation inside
// the interpreter, which no step cap sees) is a 500 naming the memory
// limit, and the server keeps serving.
func TestRunScriptMemoryLimit(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.RunScriptEnabled = true; o.ScriptMemoryBytes = 256 << 20 }})
	form, ct := scriptForm(t, "script", "x = [0] * 1000000000")
	r := e.expect(500, "POST", "/run_script", form, map[string]string{"Content-Type": ct})
	if got := string(r.body); got != "Error executing script: script memory limit exceeded (256 MiB)" {
		t.Fatalf("body = %q", got)
	}
	e.expect(200, "GET", "/healthcheck", nil)
	form, ct = scriptForm(t, "script", "result = len([0] * 1000)")
	if got := string(e.expect(200, "POST", "/run_script", form, map[string]string{"Content-Type": ct}).body); got != "1000" {
		t.Fatalf("after the limit: %q", got)
	}
	if strings.Contains(string(r.body), "goroutine") {
		t.Fatalf("runtime dump leaked into the reply: %s", r.body)
	}
	// The failure is counted by reason.
	form, ct = scriptForm(t, "script", `load("os", "os")`)
	e.expect(500, "POST", "/run_script", form, map[string]string{"Content-Type": ct})
	metrics := string(e.expect(200, "GET", "/metrics", nil).body)
	for _, want := range []string{`lmcache_mp_run_script_failures_total{reason="memory_limit"} 1`, `lmcache_mp_run_script_failures_total{reason="import_not_allowed"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
