package httpapi_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// lookupFails is an fs adapter whose LookupAndLock fails with err: a
// backend that echoes credentials in its error text.
type lookupFails struct {
	*fs.Adapter
	err error
}

func (a lookupFails) LookupAndLock(context.Context, []objkey.Key) ([]bool, error) {
	return nil, a.err
}

// TestPollPrefetchScrubsAdapterError: a warm prefetch whose L2 lookup
// failed reports the adapter's error in GET /cache/prefetches/{id}'s 200
// body, which the route table's error scrub never sees; the configured
// secrets in its text (the HTTP auth token, a secret-named --mp setting,
// the S3 secret inside the --l2-adapter JSON) are each replaced by the
// redaction marker and the rest of the text is kept.
func TestPollPrefetchScrubsAdapterError(t *testing.T) {
	const tok, mpTok, s3Key = "http-tok-8891", "coord-tok-8892", "s3-secret-8893"
	inner, _ := newFS(t)
	a := lookupFails{inner, errors.New("lookup refused: bearer " + tok + ", coordinator " + mpTok + ", signing key " + s3Key)}
	e := startWithSecrets(t, a, tok, mpTok, s3Key)
	m := e.expect(202, "POST", "/cache/prefetches", map[string]any{"model_name": testModel, "world_size": 1, "token_ids": tokSlice(0, testChunk)}).json(t)
	id, _ := m["request_id"].(string)
	if id == "" {
		t.Fatalf("submit = %v", m)
	}
	var done resp
	waitFor(t, "prefetch completion", func() bool {
		done = e.expect(200, "GET", "/cache/prefetches/"+id, nil)
		return done.json(t)["status"] == "completed"
	})
	for _, s := range []string{tok, mpTok, s3Key} {
		if strings.Contains(string(done.body), s) {
			t.Errorf("GET /cache/prefetches/{id} body leaks %q: %s", s, done.body)
		}
	}
	const want = `lookup refused: bearer ` + httpapi.Redacted + `, coordinator ` + httpapi.Redacted + `, signing key ` + httpapi.Redacted
	if got := done.json(t)["error"]; got != want {
		t.Fatalf("completed poll's error = %q, want %q", got, want)
	}
}
