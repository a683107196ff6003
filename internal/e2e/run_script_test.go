package e2e

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/proctest"
)

// TestRunScriptAfterBinaryReplaced runs `lmcache server` from a copy of
// the binary, then deletes that copy and puts another program at its path
// (what an upgrade in place or a rollback does to a running server). The
// script sandbox is the running binary itself (/proc/self/exe), not the
// file at the path, so /run_script keeps answering with the server's own
// code: 200 "42" each time, and no sandbox failure is counted.
func TestRunScriptAfterBinaryReplaced(t *testing.T) {
	orig, err := os.ReadFile(lmcacheBin(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "lmcache")
	if err := os.WriteFile(bin, orig, 0o755); err != nil {
		t.Fatal(err)
	}
	httpPort := freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	proctest.StartBinary(t, bin, "server", nil, "server", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)),
		"--l1-size-gb", "0.0625", "--run-script-api-enabled")
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))

	run := func(when string) {
		t.Helper()
		if code, body := postScript(t, base, "", "result = 6 * 7\n"); code != http.StatusOK || body != "42" {
			t.Fatalf("%s: %d %q, want 200 \"42\"", when, code, body)
		}
	}
	run("binary in place")
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	run("binary deleted")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\ncat >/dev/null\necho garbage\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run("another program at the binary's path")

	// A script's own failure, so that the counter has a series to read
	// beside the (absent or zero) sandbox one.
	if code, body := postScript(t, base, "", "fail(\"on purpose\")\n"); code != http.StatusInternalServerError || !strings.HasPrefix(body, "Error executing script: ") {
		t.Fatalf("failing script: %d %q", code, body)
	}
	metrics := metricsText(t, base)
	if got := grepLines(metrics, `lmcache_mp_run_script_failures_total{reason="sandbox"} `); got != "" && !strings.HasSuffix(got, "} 0") {
		t.Errorf("sandbox failures counted: %s", got)
	}
	if want := `lmcache_mp_run_script_failures_total{reason="error"} 1`; !strings.Contains(metrics, want+"\n") {
		t.Errorf("/metrics lacks %s", want)
	}
}

// postScript sends src to base's POST /run_script as the multipart upload
// upstream's clients make, with auth as the Authorization header unless
// it is empty, and returns the status and body.
func postScript(t *testing.T, base, auth, src string) (int, string) {
	t.Helper()
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("script", "script.star")
	_, _ = io.WriteString(fw, src)
	_ = mw.Close()
	req, err := http.NewRequest("POST", base+"/run_script", &form)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
