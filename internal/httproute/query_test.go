package httproute_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordtest"
	"github.com/lmcache-go/lmcache/internal/httproute"
)

// TestQueryTakesLast: Query keeps the last value of a repeated parameter
// (Starlette's QueryParams), keeps single values and presence, and leaves
// the request's own URL untouched.
func TestQueryTakesLast(t *testing.T) {
	r := httptest.NewRequest("GET", "/x?a=1&b=bad&b=good&c=&a=2&a=3", nil)
	q := httproute.Query(r)
	if q.Get("a") != "3" || q.Get("b") != "good" || !q.Has("c") || q.Get("c") != "" || q.Has("d") || len(q["a"]) != 1 {
		t.Fatalf("Query = %v", q)
	}
	if got := r.URL.Query()["a"]; len(got) != 3 {
		t.Fatalf("request query changed: a = %v", got)
	}
}

// TestCoordinatorRepeatedQueryParamTakesLast: the coordinator's scalar
// query parameters (tier on the quota routes, level on /periodic-threads)
// bind to their last value, as upstream's FastAPI coordinator does. (It
// lives here because the coordinator's reads go through this toolkit.)
func TestCoordinatorRepeatedQueryParamTakesLast(t *testing.T) {
	base := coordtest.Start(t, nil, nil)
	c := &http.Client{}
	t.Cleanup(c.CloseIdleConnections)
	do := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: %d %q is not a JSON object", method, path, res.StatusCode, b)
		}
		return res.StatusCode, m
	}
	if code, m := do("PUT", "/quota/tenant-a", `{"limit_gb": 2}`); code != 200 {
		t.Fatalf("PUT quota: %d %v", code, m)
	}
	// tier=bogus alone is 422 and tier=l1 alone 400; the last value wins.
	code, m := do("GET", "/quota/tenant-a?tier=bogus&tier=l2", "")
	if code != 200 || m["cache_salt"] != "tenant-a" || m["quota_limit_gb"] != float64(2) || m["quota_exists"] != true {
		t.Fatalf("tier=bogus&tier=l2: %d %v", code, m)
	}
	if code, m := do("GET", "/quota/tenant-a?tier=l2&tier=l1", ""); code != 400 || !strings.Contains(m["detail"].(string), "tier 'l1' not supported") {
		t.Fatalf("tier=l2&tier=l1: %d %v", code, m)
	}
	if code, m := do("GET", "/periodic-threads?level=urgent&level=critical", ""); code != 200 || m["threads"] == nil {
		t.Fatalf("level=urgent&level=critical: %d %v", code, m)
	}
	if code, m := do("GET", "/periodic-threads?level=critical&level=urgent", ""); code != 400 {
		t.Fatalf("level=critical&level=urgent: %d %v", code, m)
	}
}
