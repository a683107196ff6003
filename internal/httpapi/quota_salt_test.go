package httpapi_test

import (
	"net/url"
	"strings"
	"testing"
)

// TestQuotaPutRefusesImpossibleSalt: PUT /quota/{cache_salt} refuses a
// salt no store can carry (over objkey's 128 characters, or with '@', '/',
// '\' or NUL) with 400 and sets nothing. Such a quota can never be charged,
// and the path segment could be as long as the header limit, each one
// kept in memory and listed by GET /quota.
func TestQuotaPutRefusesImpossibleSalt(t *testing.T) {
	e := start(t, envOpts{})
	for salt, want := range map[string]string{
		strings.Repeat("s", 129): "cache_salt exceeds max length 128 (got 129)",
		"a@b":                    "cache_salt must not contain {\"@\"} (got 'a@b')",
		"a\\b":                   "cache_salt must not contain {\"\\\\\"} (got 'a\\b')",
		"a/b":                    "cache_salt must not contain {\"/\"} (got 'a/b')",
	} {
		m := e.expect(400, "PUT", "/quota/"+url.PathEscape(salt), `{"limit_gb": 1}`).json(t)
		if m["error"] != want {
			t.Errorf("PUT /quota/%.20q: %v, want error %q", salt, m, want)
		}
	}
	if users := e.expect(200, "GET", "/quota", nil).json(t)["users"].(map[string]any); len(users) != 0 {
		t.Errorf("refused PUTs set quotas: %v", users)
	}
	// The longest salt a store can carry, and the empty one, still work.
	e.expect(200, "PUT", "/quota/"+strings.Repeat("s", 128), `{"limit_gb": 1}`)
	e.expect(200, "PUT", "/quota/_default", `{"limit_gb": 1}`)
	if users := e.expect(200, "GET", "/quota", nil).json(t)["users"].(map[string]any); len(users) != 2 {
		t.Errorf("users = %v, want 2", users)
	}
}
