package httpapi_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// deleteFails is an fs adapter whose Delete fails with err and removes
// nothing: a backend that echoes credentials in its error text.
type deleteFails struct {
	*fs.Adapter
	err error
}

func (d deleteFails) Delete(context.Context, []objkey.Key) ([]objkey.Key, error) { return nil, d.err }

// TestDeleteObjectsScrubsAdapterError: an L2 adapter's Delete error is
// reported in DELETE /cache/objects' 200 body (ok false), which the route
// table's error scrub never sees; the configured secrets in its text (the
// HTTP auth token, a secret-named --mp setting, the S3 secret inside the
// --l2-adapter JSON) are each replaced by the redaction marker and the
// rest of the text is kept.
func TestDeleteObjectsScrubsAdapterError(t *testing.T) {
	const tok, mpTok, s3Key = "http-tok-7781", "coord-tok-7782", "s3-secret-7783"
	inner, _ := newFS(t)
	a := deleteFails{inner, errors.New("delete refused: bearer " + tok + ", coordinator " + mpTok + ", signing key " + s3Key)}
	e := startWithSecrets(t, a, tok, mpTok, s3Key)
	k := keysFor(t, tokSlice(0, testChunk), "")[0]
	r := e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": []any{encKey(k)}, "tier": "l2"})
	for _, s := range []string{tok, mpTok, s3Key} {
		if strings.Contains(string(r.body), s) {
			t.Errorf("DELETE /cache/objects body leaks %q: %s", s, r.body)
		}
	}
	const want = `{"adapter":"fs","deleted":0,"error":"delete refused: bearer ` + httpapi.Redacted + `, coordinator ` + httpapi.Redacted +
		`, signing key ` + httpapi.Redacted + `","ok":false,"requested":1,"skipped":0}`
	if got := strings.TrimSpace(string(r.body)); got != want {
		t.Fatalf("DELETE /cache/objects body\n got  %s\n want %s", got, want)
	}
}

// startWithSecrets serves adapter a as the only L2 adapter, with three
// configured secrets: tok as the HTTP auth token, mpTok as a secret-named
// --mp setting and s3Key inside the --l2-adapter JSON, so a test can check
// that each is scrubbed from text an adapter echoes.
func startWithSecrets(t *testing.T, a l2.Adapter, tok, mpTok, s3Key string) *env {
	t.Helper()
	return start(t, envOpts{noAdapters: true, extraAdapt: []l2.Adapter{a}, mutate: func(o *httpapi.Options) {
		o.AuthToken = tok
		o.Config = map[string]map[string]any{
			"mp":              {"http_auth_token": tok, "coordinator_auth_token": mpTok},
			"storage_manager": {"l2_adapter": []string{`{"type":"s3","bucket":"bkt","aws_secret_access_key":"` + s3Key + `"}`}},
		}
	}})
}
