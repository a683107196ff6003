// Package httplimit builds the HTTP servers of `lmcache server` and
// `lmcache coordinator` with limits that hold under hostile clients: a
// bounded header block per request, a cap on concurrent connections (so the
// per-connection buffers have a global bound too), and timeouts that cut
// off clients that send headers slowly (slowloris) or hold idle keep-alive
// connections open.
//
// Worst-case header memory is about MaxConns × MaxHeaderBytes × 2 (net/http
// keeps the raw line and the parsed header); with the defaults that is
// 512 × 128 KiB × 2 ≈ 128 MiB, however many clients try.
package httplimit

import (
	"log"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"

	"github.com/lmcache-go/lmcache/internal/tracing"
)

// Defaults applied by NewServer and Listener when a Limits field is zero.
const (
	// DefaultMaxHeaderBytes bounds one request's header block. It is big
	// enough for an X-LMCache-Tokens list of about 20,000 token ids; longer
	// sequences go in a request body (POST /cache/prefetches).
	DefaultMaxHeaderBytes = 128 << 10
	// DefaultMaxConns caps concurrent connections; past it Accept waits
	// for a connection to close (the kernel backlog holds the rest).
	DefaultMaxConns          = 512
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
)

// Limits bounds what clients can make a server hold.
type Limits struct {
	// MaxHeaderBytes bounds the request line plus headers of one request;
	// a larger block is answered 431 and the connection closed.
	MaxHeaderBytes int
	// MaxConns caps concurrently open connections. Negative disables the cap.
	MaxConns int
	// ReadHeaderTimeout is the time a client has to send a full header
	// block (slowloris bound).
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle for this long.
	IdleTimeout time.Duration
}

// withDefaults fills zero fields.
func (l Limits) withDefaults() Limits {
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	return l
}

// Resolved returns l with the defaults applied (for logging and docs).
func (l Limits) Resolved() Limits { return l.withDefaults() }

// NewServer returns an *http.Server for h with l's header bound and
// timeouts. There is no ReadTimeout or WriteTimeout: bodies (KV uploads)
// and responses (long polls) may legitimately take long, and their size
// is bounded by the handlers. Serve it on Listener(ln, l) so the
// connection cap applies too.
func NewServer(h http.Handler, l Limits, errLog *log.Logger) *http.Server {
	l = l.withDefaults()
	return &http.Server{
		// Every request is a top-level span when tracing is on (a no-op
		// pass-through otherwise).
		Handler:           tracing.HTTPHandler(h),
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		ErrorLog:          errLog,
	}
}

// Listener wraps ln so that at most l.MaxConns connections are open at
// once; further Accepts wait until one closes.
func Listener(ln net.Listener, l Limits) net.Listener {
	l = l.withDefaults()
	if l.MaxConns < 0 {
		return ln
	}
	return netutil.LimitListener(ln, l.MaxConns)
}
