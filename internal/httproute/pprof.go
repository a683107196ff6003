package httproute

import (
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"

	"github.com/lmcache-go/lmcache/internal/redact"
)

// Pprof is the Go profiling (net/http/pprof) route set both services
// serve under /debug/pprof/, with one protection rule: the bearer token
// whenever the service has one (profiles show heap contents and stacks),
// and with no token only loopback clients. It is a value so each service
// fills in its own token, sentinel and flag name, and a test its own
// command line.
type Pprof struct {
	// Tag is the routes' OpenAPI tag.
	Tag string
	// Token is the service's bearer token ("" = none: loopback only).
	Token string
	// Forbidden is the sentinel a refused non-loopback client's error
	// wraps; each service maps it to 403 in its own StatusMap and shape.
	Forbidden error
	// TokenFlag names the service's token flag in the refusal message and
	// the 401 description ("--auth-token").
	TokenFlag string
	// Args returns the command line cmdline serves; nil reads os.Args at
	// each request.
	Args func() []string
	// Scrub, if set, runs over the redacted command line (to replace the
	// service's configured secret values that no flag name marks).
	Scrub func(string) string
}

// Check is the routes' Route.Check: it runs after the token check, so with
// a token configured every request that reaches it is authorized; without
// one, only a loopback RemoteAddr is served.
func (p Pprof) Check(r *http.Request) error {
	if p.Token == "" && !Loopback(r.RemoteAddr) {
		return Errorf(p.Forbidden, "pprof is served to loopback clients only unless %s is set", p.TokenFlag)
	}
	return nil
}

// Cmdline is pprof's cmdline (arguments NUL-separated) with secret flag
// values hidden: the stock handler would print the token flag's value.
func (p Pprof) Cmdline(w http.ResponseWriter, _ *http.Request) error {
	args := os.Args
	if p.Args != nil {
		args = p.Args()
	}
	text := strings.Join(redact.Args(args), "\x00")
	if p.Scrub != nil {
		text = p.Scrub(text)
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	WriteText(w, http.StatusOK, text)
	return nil
}

// Routes returns the served and documented pprof routes: the index (and
// the named profiles under it), cmdline, profile, symbol (GET and POST)
// and trace. Each is Bearer with p.Check, and documents 401 and 403; the
// caller may reword a status or add its own before building its table
// (every call returns fresh maps).
func (p Pprof) Routes() []Route {
	st := func(kv ...any) map[int]string {
		m := map[int]string{
			http.StatusUnauthorized: "Bearer token missing or wrong (only with " + p.TokenFlag + ")",
			http.StatusForbidden:    "no token configured and the client is not on loopback",
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(int)] = kv[i+1].(string)
		}
		return m
	}
	seconds := func(def int) []Param { return []Param{{Name: "seconds", Type: "integer", Default: def}} }
	std := func(h http.HandlerFunc) func(http.ResponseWriter, *http.Request) error {
		return func(w http.ResponseWriter, r *http.Request) error {
			h(w, r)
			return nil
		}
	}
	rs := []Route{
		{Method: "GET", Path: "/debug/pprof/", Summary: "pprof index and named profiles (/debug/pprof/heap, goroutine, allocs, ...).", Produces: Text,
			Statuses: st(200, "profile", 404, "unknown profile"), Handle: std(pprof.Index)},
		{Method: "GET", Path: "/debug/pprof/cmdline", Summary: "The process command line, secret flag values redacted.", Produces: Text,
			Statuses: st(200, "command line"), Handle: p.Cmdline},
		{Method: "GET", Path: "/debug/pprof/profile", Summary: "CPU profile over seconds= (default 30).", Query: seconds(30), Produces: Binary,
			Statuses: st(200, "profile"), Handle: std(pprof.Profile)},
		{Method: "GET", Path: "/debug/pprof/symbol", Summary: "Symbol lookup.", Produces: Text,
			Statuses: st(200, "symbols"), Handle: std(pprof.Symbol)},
		{Method: "POST", Path: "/debug/pprof/symbol", Summary: "Symbol lookup for posted addresses.", Request: "", RequestType: Text, Produces: Text,
			Statuses: st(200, "symbols"), Handle: std(pprof.Symbol)},
		{Method: "GET", Path: "/debug/pprof/trace", Summary: "Execution trace over seconds= (default 1).", Query: seconds(1), Produces: Binary,
			Statuses: st(200, "trace"), Handle: std(pprof.Trace)},
	}
	for i := range rs {
		rs[i].Tag, rs[i].Auth, rs[i].Check = p.Tag, Bearer, p.Check
	}
	return rs
}

// Loopback reports whether a request's RemoteAddr ("host:port", or a bare
// host) is a loopback address.
func Loopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
