package httpapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestRepeatedQueryParamTakesLast: a repeated scalar query parameter binds
// to its last value, as FastAPI (Starlette's QueryParams) does, on every
// MP route that reads one: /cache/objects (tier, page_size), /loglevel
// (logger_name, level, and the auth decision on level), /threads (name)
// and /periodic-threads (level).
func TestRepeatedQueryParamTakesLast(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.AuthToken = "tok" }})
	e.store(tokens(0, 2*testChunk), "", payload(2, 1))
	e.waitListed(2)

	// The first value of each would be a 400 (tier=l1) or 422 (page_size=0).
	m := e.expect(200, "GET", "/cache/objects?tier=l1&tier=l2&page_size=0&page_size=1", nil).json(t)
	if ents, _ := m["entries"].([]any); len(ents) != 1 || m["next_page_token"] == nil {
		t.Fatalf("page_size=0&page_size=1: %v, want one entry and a next_page_token", m)
	}
	// And the reverse: the last value is the one validated.
	if r := e.expect(422, "GET", "/cache/objects?page_size=1&page_size=0", nil); !strings.Contains(string(r.body), `"page_size"`) {
		t.Fatalf("page_size=1&page_size=0: %s", r.body)
	}

	if r := e.expect(200, "GET", "/loglevel?logger_name=nope&logger_name=lmcache.http", nil); string(r.body) != "lmcache.http: INFO" {
		t.Fatalf("logger_name=nope&logger_name=lmcache.http: %q", r.body)
	}
	// level=&level=DEBUG sets DEBUG, so it needs the token like level=DEBUG.
	anon := map[string]string{"Authorization": ""}
	e.expect(401, "GET", "/loglevel?logger_name=qx&level=&level=DEBUG", nil, anon)
	if r := e.expect(200, "GET", "/loglevel?logger_name=qx&level=BOGUS&level=DEBUG", nil); string(r.body) != "Set qx level to DEBUG (including all handlers)" {
		t.Fatalf("level=BOGUS&level=DEBUG: %q", r.body)
	}

	// The first name= matches no goroutine; the last (empty) keeps them all.
	if r := e.expect(200, "GET", "/threads?name=no-such-label&name=", nil); !strings.Contains(string(r.body), "=== Thread Summary ===") || strings.Contains(string(r.body), "\nTotal threads: 0\n") {
		t.Fatalf("name=no-such-label&name=: %q", r.body)
	}

	e.loops.Register("q-low", periodic.Low, time.Hour, time.Hour, func(context.Context) (periodic.Summary, error) { return periodic.Summary{}, nil })
	e.loops.Register("q-crit", periodic.Critical, time.Hour, time.Hour, func(context.Context) (periodic.Summary, error) { return periodic.Summary{}, nil })
	m = e.expect(200, "GET", "/periodic-threads?level=urgent&level=low", nil).json(t)
	th, _ := m["threads"].([]any)
	if len(th) != 1 || th[0].(map[string]any)["name"] != "q-low" {
		t.Fatalf("level=urgent&level=low: %v, want only q-low", m)
	}
	if m := e.expect(400, "GET", "/periodic-threads?level=low&level=urgent", nil).json(t); m["error"] != "Invalid level: urgent. Valid values: critical, high, medium, low" {
		t.Fatalf("level=low&level=urgent: %v", m)
	}
}
