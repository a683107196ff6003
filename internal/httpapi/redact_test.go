package httpapi_test

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestConfigRedacted: secrets in the configuration (the auth token, keys
// inside the --l2-adapter JSON string) never reach /config or a script's
// app.config(), and other values come through unchanged.
func TestConfigRedacted(t *testing.T) {
	const tok, key, sess = "auth-marker-1", "aws-secret-marker-2", "session-marker-3"
	adapter := `{"type":"s3","bucket":"bkt","aws_access_key_id":"AKIA-marker-4","aws_secret_access_key":"` + key + `","aws_session_token":"` + sess + `"}`
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.AuthToken = tok
		o.RunScriptEnabled = true
		o.Config = map[string]map[string]any{
			"mp":              {"http_auth_token": tok, "chunk_size": 16, "l1_size_gb": 0.5},
			"storage_manager": {"l2_adapter": []string{adapter}},
		}
	}})
	body := string(e.expect(200, "GET", "/config", nil).body)
	for _, m := range []string{tok, key, sess, "AKIA-marker-4"} {
		if strings.Contains(body, m) {
			t.Fatalf("/config leaks %q: %s", m, body)
		}
	}
	for _, keep := range []string{`"chunk_size": 16`, `"l1_size_gb": 0.5`, `\"bucket\":\"bkt\"`, `"http_auth_token": "` + httpapi.Redacted + `"`} {
		if !strings.Contains(body, keep) {
			t.Fatalf("/config lost %s: %s", keep, body)
		}
	}
	form, ct := scriptForm(t, "script", `result = str(app.config())`)
	out := string(e.expect(200, "POST", "/run_script", form, map[string]string{"Content-Type": ct}).body)
	for _, m := range []string{tok, key, sess, "AKIA-marker-4"} {
		if strings.Contains(out, m) {
			t.Fatalf("app.config() leaks %q: %s", m, out)
		}
	}
	if !strings.Contains(out, httpapi.Redacted) || !strings.Contains(out, "bkt") {
		t.Fatalf("app.config() = %s", out)
	}
	// A script that prints the token it was told cannot echo it back: the
	// configured secret values are scrubbed from output and errors.
	form, ct = scriptForm(t, "script", `fail("`+tok+`")`)
	if r := e.expect(500, "POST", "/run_script", form, map[string]string{"Content-Type": ct}); strings.Contains(string(r.body), tok) {
		t.Fatalf("script error echoes the token: %s", r.body)
	}
}
