package httproute_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/redact"
)

// TestPprofCheck: without a token only loopback RemoteAddrs (IPv4, IPv6,
// with or without a port) pass, others get the caller's sentinel with a
// message naming its flag; with a token every address passes (the token
// check before it is the rule).
func TestPprofCheck(t *testing.T) {
	forbidden := errors.New("forbidden")
	for _, tc := range []struct {
		token, remote string
		ok            bool
	}{
		{"", "127.0.0.1:5000", true}, {"", "[::1]:5000", true}, {"", "127.0.0.2", true},
		{"", "10.0.0.1:1234", false}, {"", "[2001:db8::1]:80", false}, {"", "", false}, {"", "not-an-address", false},
		{"tok", "10.0.0.1:1234", true}, {"tok", "127.0.0.1:1", true},
	} {
		p := httproute.Pprof{Token: tc.token, Forbidden: forbidden, TokenFlag: "--some-token"}
		r := httptest.NewRequest("GET", "/debug/pprof/", nil)
		r.RemoteAddr = tc.remote
		err := p.Check(r)
		if tc.ok != (err == nil) {
			t.Errorf("token %q from %q: %v", tc.token, tc.remote, err)
		}
		if err != nil && (!errors.Is(err, forbidden) || err.Error() != "pprof is served to loopback clients only unless --some-token is set") {
			t.Errorf("token %q from %q: error %v (is forbidden: %v)", tc.token, tc.remote, err, errors.Is(err, forbidden))
		}
	}
}

// TestPprofCmdline: the command line comes from Args, secret flag values
// are hidden in both spellings, JSON flag values inside, then Scrub runs
// over the result; arguments are NUL-separated, text/plain and nosniff.
func TestPprofCmdline(t *testing.T) {
	p := httproute.Pprof{
		Args: func() []string {
			return []string{"lmcache", "--auth-token", "tok-1", "--mp-auth-token=tok-2", "--l2-adapter", `{"aws_secret_access_key":"key-3"}`, "--name", "plain-4"}
		},
		Scrub: func(s string) string { return strings.ReplaceAll(s, "plain-4", "SCRUBBED") },
	}
	w := httptest.NewRecorder()
	if err := p.Cmdline(w, httptest.NewRequest("GET", "/debug/pprof/cmdline", nil)); err != nil {
		t.Fatal(err)
	}
	body := w.Body.String()
	for _, secret := range []string{"tok-1", "tok-2", "key-3", "plain-4"} {
		if strings.Contains(body, secret) {
			t.Errorf("cmdline shows %q: %q", secret, body)
		}
	}
	if !strings.HasPrefix(body, "lmcache\x00--auth-token\x00"+redact.Marker+"\x00--mp-auth-token="+redact.Marker+"\x00--l2-adapter\x00") ||
		!strings.HasSuffix(body, "\x00--name\x00SCRUBBED") {
		t.Errorf("cmdline = %q", body)
	}
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") || w.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("cmdline: %d %v", w.Code, w.Header())
	}
}

// TestPprofRoutes: the route set is the six pprof endpoints, each Bearer,
// tagged, with the loopback Check and 401/403 documented (401 naming the
// flag); a table built from it serves them: 401 without the token, the
// index and cmdline with it, 403 to a non-loopback client when no token
// is set; the document types seconds as an integer. Every call returns
// fresh status maps, so a caller's edits do not leak.
func TestPprofRoutes(t *testing.T) {
	forbidden := errors.New("forbidden")
	p := httproute.Pprof{Tag: "diag", Token: "tok", Forbidden: forbidden, TokenFlag: "--tok", Args: func() []string { return []string{"bin", "--x"} }}
	rs := p.Routes()
	var got []string
	for _, rt := range rs {
		got = append(got, rt.Pattern())
		if rt.Auth != httproute.Bearer || rt.Tag != "diag" || rt.Check == nil || rt.Handle == nil {
			t.Errorf("%s: auth %v tag %q check %v", rt.Pattern(), rt.Auth, rt.Tag, rt.Check != nil)
		}
		if rt.Statuses[401] != "Bearer token missing or wrong (only with --tok)" || rt.Statuses[403] == "" || rt.Statuses[200] == "" {
			t.Errorf("%s: statuses %v", rt.Pattern(), rt.Statuses)
		}
	}
	want := "GET /debug/pprof/,GET /debug/pprof/cmdline,GET /debug/pprof/profile,GET /debug/pprof/symbol,POST /debug/pprof/symbol,GET /debug/pprof/trace"
	if strings.Join(got, ",") != want {
		t.Fatalf("routes %q", got)
	}
	rs[0].Statuses[418] = "edited"
	if _, ok := p.Routes()[0].Statuses[418]; ok {
		t.Fatal("Routes shares its status maps between calls")
	}

	statuses := httproute.StatusMap{{Status: http.StatusForbidden, Errs: []error{forbidden}}}
	tab, err := httproute.New(httproute.Config{Title: "t", Version: "1", Token: "tok", Errors: httproute.Errors{Statuses: statuses, Realm: "t"}}, p.Routes())
	if err != nil {
		t.Fatal(err)
	}
	serve := func(tab *httproute.Table, path, auth, remote string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = remote
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		tab.Handler().ServeHTTP(w, r)
		return w
	}
	if w := serve(tab, "/debug/pprof/", "", "127.0.0.1:1"); w.Code != 401 {
		t.Errorf("index without the token: %d %s", w.Code, w.Body)
	}
	if w := serve(tab, "/debug/pprof/", "Bearer tok", "10.0.0.1:1"); w.Code != 200 || !strings.Contains(w.Body.String(), "goroutine") {
		t.Errorf("index with the token: %d %.200s", w.Code, w.Body)
	}
	if w := serve(tab, "/debug/pprof/cmdline", "Bearer tok", "10.0.0.1:1"); w.Code != 200 || w.Body.String() != "bin\x00--x" {
		t.Errorf("cmdline with the token: %d %q", w.Code, w.Body)
	}
	doc, err := tab.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/debug/pprof/profile", "/debug/pprof/trace"} {
		ps := doc.Paths.Value(path).Get.Parameters
		if len(ps) != 1 || ps[0].Value.Name != "seconds" || !ps[0].Value.Schema.Value.Type.Is("integer") {
			t.Errorf("%s parameters %+v", path, ps)
		}
	}

	p.Token = ""
	open, err := httproute.New(httproute.Config{Title: "t", Version: "1", Errors: httproute.Errors{Statuses: statuses, Realm: "t"}}, p.Routes())
	if err != nil {
		t.Fatal(err)
	}
	if w := serve(open, "/debug/pprof/", "", "10.0.0.1:1"); w.Code != 403 || w.Body.String() != `{"detail":"pprof is served to loopback clients only unless --tok is set"}` {
		t.Errorf("index from a non-loopback client without a token: %d %s", w.Code, w.Body)
	}
	if w := serve(open, "/debug/pprof/", "", "[::1]:1"); w.Code != 200 {
		t.Errorf("index from loopback without a token: %d %s", w.Code, w.Body)
	}
}
