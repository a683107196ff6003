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
//
// The server also counts its running handlers, so that Stop returns only
// after the last one has returned: the caller may then close what the
// handlers use (the engine, an MP client, an etcd session) without a
// handler still using it. http.Server.Close alone does not wait for them.
package httplimit

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/lmcache-go/lmcache/internal/httproute"
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
	// StuckLogAfter is how long Stop waits, after closing the connections
	// of requests that outlived the drain, before it logs the handlers
	// still running (they ignore their request's cancellation). It keeps
	// waiting after the log: see Stop.
	StuckLogAfter = 5 * time.Second
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

// Server is an *http.Server whose handler is counted: Stop (or Close
// followed by WaitHandlers) returns only once every handler has returned.
type Server struct {
	*http.Server
	calls  *tracker
	errLog *log.Logger
}

// NewServer returns a Server for h with l's header bound and timeouts.
// There is no ReadTimeout or WriteTimeout: bodies (KV uploads) and
// responses (long polls) may legitimately take long, and their size is
// bounded by the handlers. Serve it on Listener(ln, l) so the connection
// cap applies too, and stop it with Stop.
func NewServer(h http.Handler, l Limits, errLog *log.Logger) *Server {
	l = l.withDefaults()
	calls := newTracker()
	return &Server{
		Server: &http.Server{
			// Every request is a top-level span when tracing is on (a
			// no-op pass-through otherwise); the count is outermost so a
			// handler is done only once its span has ended too.
			Handler:           calls.wrap(tracing.HTTPHandler(h)),
			MaxHeaderBytes:    l.MaxHeaderBytes,
			ReadHeaderTimeout: l.ReadHeaderTimeout,
			IdleTimeout:       l.IdleTimeout,
			ErrorLog:          errLog,
		},
		calls:  calls,
		errLog: errLog,
	}
}

// Running is the number of handlers running now.
func (s *Server) Running() int { return s.calls.count() }

// WaitHandlers blocks until no handler is running or ctx is done; in the
// latter case it returns an error wrapping ctx.Err() that names the
// handlers still running.
func (s *Server) WaitHandlers(ctx context.Context) error {
	if err := s.calls.wait(ctx); err != nil {
		return fmt.Errorf("httplimit: %s still running: %w", s.calls.describe(), err)
	}
	return nil
}

// Stop shuts the server down: it stops accepting, gives the requests in
// flight up to drain to finish (http.Server.Shutdown), then closes the
// connections still open and waits until every handler has returned. A
// request that reaches a handler after that close is answered 503 without
// running it. When Stop returns no handler runs or will run, so the caller
// may close the handlers' dependencies.
//
// The wait after the close has no bound of its own, on purpose. By then
// each remaining handler's connection is closed and its request context
// cancelled, so only a handler that ignores both is still running, and
// closing what it uses under it (an engine's memory pool, an etcd client)
// trades a slow stop for a use-after-close. The process supervisor's stop
// timeout (systemd's TimeoutStopSec, Kubernetes' grace period) is the
// outer bound, and its SIGKILL is safe. So that such a stop is not silent,
// Stop logs the handlers still running StuckLogAfter after the close, once.
//
// Stop returns nil when everything drained in time, an error wrapping
// Shutdown's (context.DeadlineExceeded) that says how many requests were
// cut off, or Shutdown's error closing the listener.
func (s *Server) Stop(drain time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	shutErr := s.Shutdown(ctx)
	cutOff := shutErr != nil && ctx.Err() != nil
	var cut int
	if cutOff {
		cut = s.calls.count()
		// Refuse first, then close: a connection that read its request
		// just before the close must not start a handler after the wait.
		s.calls.refuse()
		_ = s.Close()
	} else {
		s.calls.refuse()
	}
	logCtx, logCancel := context.WithTimeout(context.Background(), StuckLogAfter)
	defer logCancel()
	if s.calls.wait(logCtx) != nil {
		s.logf("httplimit: %s still running %v after their connections were closed; shutdown waits for them", s.calls.describe(), StuckLogAfter)
		_ = s.calls.wait(context.Background())
	}
	if cutOff {
		return fmt.Errorf("httplimit: drain deadline %v passed with %d requests running; closed their connections and waited for their handlers: %w", drain, cut, shutErr)
	}
	if shutErr != nil {
		return fmt.Errorf("httplimit: shutdown: %w", shutErr)
	}
	return nil
}

func (s *Server) logf(format string, args ...any) {
	if s.errLog != nil {
		s.errLog.Printf(format, args...)
		return
	}
	log.Printf(format, args...)
}

// tracker counts running handlers. A WaitGroup does not fit: a request can
// start (Add from zero) while Stop waits, which WaitGroup forbids.
type tracker struct {
	mu      sync.Mutex
	running map[*call]struct{}
	idle    chan struct{} // closed while nothing runs; replaced when a call starts
	refused bool
}

// call is one running handler, kept to name it in the stuck log.
type call struct {
	method, path string
}

func newTracker() *tracker {
	idle := make(chan struct{})
	close(idle)
	return &tracker{running: map[*call]struct{}{}, idle: idle}
}

func (t *tracker) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &call{method: r.Method, path: r.URL.Path}
		if !t.begin(c) {
			// In the services' FastAPI error shape, {"detail": ...}.
			w.Header().Set("Connection", "close")
			httproute.WriteJSON(w, http.StatusServiceUnavailable, httproute.DetailBody{Detail: "server is shutting down"})
			return
		}
		defer t.end(c)
		h.ServeHTTP(w, r)
	})
}

// begin registers c unless the tracker refuses new calls.
func (t *tracker) begin(c *call) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refused {
		return false
	}
	if len(t.running) == 0 {
		t.idle = make(chan struct{})
	}
	t.running[c] = struct{}{}
	return true
}

func (t *tracker) end(c *call) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.running, c)
	if len(t.running) == 0 {
		close(t.idle)
	}
}

func (t *tracker) refuse() {
	t.mu.Lock()
	t.refused = true
	t.mu.Unlock()
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.running)
}

// wait returns once nothing runs, or ctx's error. It loops because a call
// may start between the idle channel closing and wait reading the count.
func (t *tracker) wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		n, idle := len(t.running), t.idle
		t.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// describe names the running calls, e.g. "2 handlers (GET /a, POST /b)".
func (t *tracker) describe() string {
	t.mu.Lock()
	total := len(t.running)
	names := make([]string, 0, total)
	for c := range t.running {
		names = append(names, c.method+" "+c.path)
	}
	t.mu.Unlock()
	sort.Strings(names)
	const show = 8
	more := ""
	if len(names) > show {
		more = fmt.Sprintf(", and %d more", len(names)-show)
		names = names[:show]
	}
	noun := "handlers"
	if total == 1 {
		noun = "handler"
	}
	return fmt.Sprintf("%d %s (%s%s)", total, noun, strings.Join(names, ", "), more)
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
