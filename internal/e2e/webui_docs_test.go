package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// openAPIOperations lists "METHOD path" of every operation in base's
// /openapi.json.
func openAPIOperations(t *testing.T, base string) []string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if code, _ := call(t, "GET", base+"/openapi.json", nil, nil, &doc); code != 200 {
		t.Fatalf("GET /openapi.json: %d", code)
	}
	var ops []string
	for p, item := range doc.Paths {
		for m := range item {
			switch m {
			case "get", "put", "post", "delete", "patch", "head", "options":
				ops = append(ops, strings.ToUpper(m)+" "+p)
			}
		}
	}
	sort.Strings(ops)
	return ops
}

// docsShowEveryRoute loads base's /docs in Chromium and waits until Swagger
// UI lists exactly the operations of /openapi.json; then /redoc renders
// one section per operation.
func docsShowEveryRoute(t *testing.T, ctx context.Context, base, name string) {
	t.Helper()
	want := openAPIOperations(t, base)
	if len(want) < 20 {
		t.Fatalf("%s: only %d operations in /openapi.json", name, len(want))
	}
	browse(t, ctx, chromedp.Navigate(base+"/docs"), chromedp.WaitReady(".opblock"))
	eventually(t, name+" /docs lists every route", func() string {
		var got []string
		eval(t, ctx, `[...document.querySelectorAll('.opblock')].map(o => o.querySelector('.opblock-summary-method').textContent.trim() + ' ' +
			(o.querySelector('.opblock-summary-path').dataset.path || o.querySelector('.opblock-summary-path').textContent.trim()))`, &got)
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Sprintf("page %d operations %v, /openapi.json %d %v", len(got), got, len(want), want)
		}
		return ""
	})
	screenshot(t, ctx, "docs-"+name)
	browse(t, ctx, chromedp.Navigate(base+"/redoc"), chromedp.WaitReady(`[data-section-id^="operation/"]`))
	eventually(t, name+" /redoc has a section per route", func() string {
		var n int
		eval(t, ctx, `new Set([...document.querySelectorAll('[data-section-id^="operation/"]')].map(e => e.dataset.sectionId)).size`, &n)
		if n != len(want) {
			return fmt.Sprintf("%d operation sections, want %d", n, len(want))
		}
		return ""
	})
}

// TestDocsPagesListEveryRoute loads /docs (Swagger UI) and /redoc of a real
// server (run with --http-auth-token: the pages and /openapi.json stay open)
// and a real coordinator in headless Chromium: each lists every operation
// of its /openapi.json, all served by the binary.
func TestDocsPagesListEveryRoute(t *testing.T) {
	ctx := browser(t)
	srvPort, coordPort := freePort(t), freePort(t)
	start(t, "server-docs", nil, "server", "--http-port", itoa(srvPort), "--port", itoa(freePort(t)), "--l1-size-gb", "0.0625",
		"--http-auth-token", "docs-tok")
	start(t, "coordinator-docs", nil, "coordinator", "--host", "127.0.0.1", "--port", itoa(coordPort))
	srv, coord := "http://127.0.0.1:"+itoa(srvPort), "http://127.0.0.1:"+itoa(coordPort)
	waitFor(t, "server healthcheck", healthy(srv+"/healthcheck"))
	waitFor(t, "coordinator healthz", healthy(coord+"/healthz"))
	t.Run("server", func(t *testing.T) { docsShowEveryRoute(t, ctx, srv, "server") })
	t.Run("coordinator", func(t *testing.T) { docsShowEveryRoute(t, ctx, coord, "coordinator") })
}
