package webui

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httproute"
)

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	res := rec.Result()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

// TestServesPageAndAssets: the page names its service and every asset it
// loads is served with its content type and the same-origin policy.
func TestServesPageAndAssets(t *testing.T) {
	for _, svc := range []Service{Server, Coordinator} {
		h := New(svc)
		for _, p := range []string{"/ui", "/ui/", "/ui/index.html"} {
			res, body := get(t, h, p)
			if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/html; charset=utf-8" {
				t.Fatalf("%s %s: %d %s", svc, p, res.StatusCode, res.Header.Get("Content-Type"))
			}
			if !strings.Contains(body, `data-service="`+string(svc)+`"`) || strings.Contains(body, "{{SERVICE}}") {
				t.Fatalf("%s page does not name its service: %.200s", svc, body)
			}
			if res.Header.Get("Content-Security-Policy") != csp {
				t.Fatalf("CSP %q", res.Header.Get("Content-Security-Policy"))
			}
		}
		_, page := get(t, h, "/ui")
		refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page, -1)
		if len(refs) != 4 {
			t.Fatalf("page references %d assets, want 4: %v", len(refs), refs)
		}
		for _, ref := range refs {
			res, body := get(t, h, ref[1])
			if res.StatusCode != http.StatusOK || len(body) == 0 {
				t.Fatalf("%s: %d, %d bytes", ref[1], res.StatusCode, len(body))
			}
			want := map[bool]string{true: "text/javascript; charset=utf-8", false: "text/css; charset=utf-8"}[strings.HasSuffix(ref[1], ".js")]
			if res.Header.Get("Content-Type") != want || res.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Fatalf("%s: headers %v", ref[1], res.Header)
			}
		}
	}
}

// TestUnknownNames404: only the listed assets are served; traversal and
// the source tree (package.json, node_modules) are not, and the 404 is
// the toolkit's FastAPI body {"detail":"Not Found"} (JSON, not text), from
// ServeHTTP and, as an ErrNoRoute error for the route table, from Serve.
func TestUnknownNames404(t *testing.T) {
	h := New(Server)
	for _, p := range []string{"/ui/package.json", "/ui/package-lock.json", "/ui/vendor/uplot/LICENSE", "/ui/../webui.go", "/ui/./console.js", "/ui/nope.js", "/ui/console.js/"} {
		res, body := get(t, h, p)
		if res.StatusCode != http.StatusNotFound || body != `{"detail":"Not Found"}` || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %q (%s), want 404 {\"detail\":\"Not Found\"}", p, res.StatusCode, body, res.Header.Get("Content-Type"))
		}
		rec := httptest.NewRecorder()
		err := h.Serve(rec, httptest.NewRequest("GET", p, nil))
		if !errors.Is(err, httproute.ErrNoRoute) || err.Error() != "Not Found" || rec.Body.Len() != 0 {
			t.Errorf("%s: Serve returned %v and wrote %q", p, err, rec.Body.String())
		}
	}
	if res, body := get(t, h, "/ui/uPlot.LICENSE.txt"); res.StatusCode != 200 || !strings.Contains(body, "MIT License") {
		t.Errorf("licence: %d %.80s", res.StatusCode, body)
	}
}

// TestNoExternalReferences: nothing the page loads names another origin
// (the console works offline and leaks nothing to a CDN).
func TestNoExternalReferences(t *testing.T) {
	url := regexp.MustCompile(`(?i)(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for name, f := range files {
		b, err := assets.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if name == "uPlot.LICENSE.txt" {
			continue
		}
		// uPlot's minified source names the SVG namespace and its home
		// page in a comment; neither is fetched.
		s := strings.NewReplacer("http://www.w3.org/2000/svg", "", "https://github.com/leeoniya/uPlot", "").Replace(string(b))
		if m := url.FindString(s); m != "" {
			t.Errorf("%s references %s", name, m)
		}
	}
	if m := regexp.MustCompile(`(?i)https?://`).FindString(string(indexHTML)); m != "" {
		t.Errorf("index.html references %s", m)
	}
}

// TestVendoredUPlotPinned: the embedded uPlot is the version package.json
// and package-lock.json pin, with its MIT licence.
func TestVendoredUPlotPinned(t *testing.T) {
	var pkg struct {
		Description  string            `json:"description"`
		Dependencies map[string]string `json:"dependencies"`
	}
	var lock struct {
		Packages map[string]struct {
			Version   string `json:"version"`
			Integrity string `json:"integrity"`
			License   string `json:"license"`
		} `json:"packages"`
	}
	for f, v := range map[string]any{"assets/package.json": &pkg, "assets/package-lock.json": &lock} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	// The description names the Go file whose go:embed line picks the
	// vendored files; that file exists and embeds them.
	src, err := os.ReadFile("webui.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pkg.Description, "internal/webui/webui.go") || !strings.Contains(string(src), "//go:embed assets/console.js assets/console.css assets/vendor/uplot/uPlot.iife.min.js assets/vendor/uplot/uPlot.min.css assets/vendor/uplot/LICENSE") {
		t.Fatalf("package.json description %q does not name webui.go's go:embed line", pkg.Description)
	}
	l := lock.Packages["node_modules/uplot"]
	if pkg.Dependencies["uplot"] != l.Version || l.Version == "" || l.License != "MIT" || !strings.HasPrefix(l.Integrity, "sha512-") {
		t.Fatalf("package.json pins %q, lock has %+v", pkg.Dependencies["uplot"], l)
	}
	js, err := assets.ReadFile("assets/vendor/uplot/uPlot.iife.min.js")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(js), "/*! https://github.com/leeoniya/uPlot (v"+l.Version+") */") || !strings.Contains(string(js), "var uPlot") {
		t.Fatalf("vendored file is not uPlot's IIFE build: %.80s", js)
	}
}
