package httpapi_test

import "testing"

// TestBadPageTokenSentinel: the fs and dax adapters reject a token they
// did not issue with l2.ErrBadPageToken, which the status table maps to
// 400 (no matching on error text).
func TestBadPageTokenSentinel(t *testing.T) {
	e := start(t, envOpts{})
	for adapter, want := range map[string]string{
		"fs":  "malformed page_token: fs: list: malformed page token: illegal base64 data at input byte 0",
		"dax": "malformed page_token: dax: list: malformed page token: illegal base64 data at input byte 0",
	} {
		m := e.expect(400, "GET", "/cache/objects?adapter="+adapter+"&page_token=%21%21not-base64", nil).json(t)
		if m["detail"] != want {
			t.Errorf("%s: body %v, want detail %q", adapter, m, want)
		}
	}
}
