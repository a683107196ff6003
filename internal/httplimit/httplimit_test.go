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

// TestConnCap: with MaxConns 2, no more than two requests are ever in the
// handler at once, and all five are served once the first ones finish.
func TestConnCap(t *testing.T) {
	var active, peak atomic.Int32
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := active.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		active.Add(-1)
	})
	addr := serve(t, h, httplimit.Limits{MaxConns: 2})
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	codes := make(chan int, 5)
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get("http://" + addr + "/")
			if err != nil {
				codes <- -1
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for active.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests reached the handler", active.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("request status %d", c)
		}
	}
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak concurrent requests = %d, want 2", p)
	}
}
