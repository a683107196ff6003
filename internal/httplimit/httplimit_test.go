package httplimit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/httplimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs a limited server on a real loopback listener until the test ends.
func serve(t *testing.T, h http.Handler, l httplimit.Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httplimit.NewServer(h, l, nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(httplimit.Listener(ln, l)) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func TestDefaults(t *testing.T) {
	srv := httplimit.NewServer(http.NotFoundHandler(), httplimit.Limits{}, nil)
	if srv.MaxHeaderBytes != 128<<10 || srv.ReadHeaderTimeout != 10*time.Second || srv.IdleTimeout != 60*time.Second {
		t.Fatalf("server = header %d, rht %v, idle %v", srv.MaxHeaderBytes, srv.ReadHeaderTimeout, srv.IdleTimeout)
	}
	if l := (httplimit.Limits{}).Resolved(); l.MaxConns != 512 {
		t.Fatalf("MaxConns default = %d", l.MaxConns)
	}
}

// TestHeaderTooLarge: a header block past MaxHeaderBytes is refused with 431
// before the handler runs.
func TestHeaderTooLarge(t *testing.T) {
	var calls atomic.Int32
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }), httplimit.Limits{MaxHeaderBytes: 4 << 10})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// 64 KiB of header that never ends: the server must answer before the
	// terminating blank line.
	go func() {
		_, _ = fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n", strings.Repeat("a", 64<<10))
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || calls.Load() != 0 {
		t.Fatalf("status %d, handler calls %d", resp.StatusCode, calls.Load())
	}
}

// TestSlowHeaderIsCut: a client that never finishes its header is
// disconnected by ReadHeaderTimeout.
func TestSlowHeaderIsCut(t *testing.T) {
	addr := serve(t, http.NotFoundHandler(), httplimit.Limits{ReadHeaderTimeout: 100 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	// The server closes the connection; the read ends (EOF or reset)
	// instead of blocking until this test's own deadline.
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("server kept a never-finished header open for 30s")
	}
}

// pipeListener hands the server the server ends of net.Pipe connections
// the test dials. Every blocking step in it, in net.Pipe, in the cap's
// semaphore and in the handler is a channel operation, so inside a
// synctest bubble synctest.Wait returns exactly when the server can make no
// further progress: what has not happened by then cannot happen.
type pipeListener struct {
	conns    chan net.Conn // dialled, not yet accepted
	closed   chan struct{}
	once     sync.Once
	accepted atomic.Int32 // connections this (inner) listener handed out
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		l.accepted.Add(1)
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// TestConnCap: with MaxConns 2 and five clients whose handlers block, once
// the server can make no progress exactly two handlers run and exactly two
// connections were accepted (three wait unaccepted); releasing one handler
// admits exactly one more, and all five are served in the end.
func TestConnCap(t *testing.T) { checkConnCap(t, httplimit.Limits{MaxConns: 2}, 2) }

// TestDefaultConnCapIs512: the same with the default Limits both services
// use: 512 handlers hold 512 connections, the 513th, 514th and 515th wait
// unaccepted, and releasing one admits exactly one more.
func TestDefaultConnCapIs512(t *testing.T) {
	if httplimit.DefaultMaxConns != 512 {
		t.Fatalf("DefaultMaxConns = %d, want 512", httplimit.DefaultMaxConns)
	}
	checkConnCap(t, httplimit.Limits{}, 512)
}

// checkConnCap serves capacity+3 clients whose handlers block through
// limits and checks that exactly capacity connections are accepted at once.
func checkConnCap(t *testing.T, l httplimit.Limits, capacity int) {
	t.Helper()
	clients := capacity + 3
	synctest.Test(t, func(t *testing.T) {
		var active atomic.Int32
		started := make(chan struct{}, clients)
		release := make(chan struct{})
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			active.Add(1)
			started <- struct{}{}
			<-release
			active.Add(-1)
		})
		ln := &pipeListener{conns: make(chan net.Conn, clients), closed: make(chan struct{})}
		srv := httplimit.NewServer(h, l, nil)
		served := make(chan error, 1)
		go func() { served <- srv.Serve(httplimit.Listener(ln, l)) }()
		var releaseAll sync.Once
		free := func() { releaseAll.Do(func() { close(release) }) }
		// On a failure, unblock and stop everything so the bubble can end
		// and the failure is reported instead of a deadlock panic.
		t.Cleanup(func() {
			free()
			_ = srv.Close()
			_ = ln.Close()
		})

		codes := make(chan int, clients)
		for range clients {
			cli, end := net.Pipe()
			ln.conns <- end
			go func() {
				defer cli.Close()
				if _, err := io.WriteString(cli, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
					codes <- -1
					return
				}
				resp, err := http.ReadResponse(bufio.NewReader(cli), nil)
				if err != nil {
					codes <- -2
					return
				}
				resp.Body.Close()
				codes <- resp.StatusCode
			}()
		}
		// waitStarted waits for the next handler to start; the deadline is
		// the bubble's fake clock, so it only fires if nothing else can run.
		waitStarted := func() {
			t.Helper()
			select {
			case <-started:
			case <-time.After(time.Minute):
				t.Fatalf("no handler started; %d running, %d accepted", active.Load(), ln.accepted.Load())
			}
		}
		check := func(stage string, running, accepted, waiting int) {
			t.Helper()
			synctest.Wait()
			if a, n, w := active.Load(), ln.accepted.Load(), len(ln.conns); a != int32(running) || n != int32(accepted) || w != waiting {
				t.Fatalf("%s: %d handlers running, %d connections accepted, %d waiting; want %d, %d, %d",
					stage, a, n, w, running, accepted, waiting)
			}
		}
		for range capacity {
			waitStarted()
		}
		check(fmt.Sprintf("%d clients, cap %d", clients, capacity), capacity, capacity, 3)

		release <- struct{}{} // one handler returns; its connection closes
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("first response status %d", c)
		}
		waitStarted()
		check("one released", capacity, capacity+1, 2)

		free()
		for range clients - 1 {
			if c := <-codes; c != http.StatusOK {
				t.Fatalf("response status %d", c)
			}
		}
		if n := ln.accepted.Load(); n != int32(clients) {
			t.Fatalf("%d connections accepted, want %d", n, clients)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
	})
}
