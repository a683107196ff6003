package coordinator_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
)

// shutdownListener hands Run the server ends of net.Pipe connections, so
// every blocking step is a channel operation a synctest bubble can see.
type shutdownListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *shutdownListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *shutdownListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *shutdownListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TestRunClosesDepsAfterHandlerPastDrain: a request whose handler outlives
// the drain deadline and ignores its cancelled context has its connection
// closed, and Run closes the MP client and the HA session only after the
// handler has returned (before the fix, srv.Close returned at once and
// they were closed under it).
func TestRunClosesDepsAfterHandlerPastDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered, cancelled, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var returned atomic.Bool
		closing := make(chan bool, 1) // whether the handler had returned when Run closed its dependencies
		srv, err := coordinator.New(testConfig(),
			coordinator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
			coordinator.WithDrainTimeout(time.Second),
			coordinator.WithBeforeClose(func() { closing <- returned.Load() }))
		if err != nil {
			t.Fatal(err)
		}
		srv.WrapHandler(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/block" {
					next.ServeHTTP(w, r)
					return
				}
				close(entered)
				<-r.Context().Done() // the close after the drain deadline
				close(cancelled)
				<-release // then it ignores the cancellation, as a handler mid-write to etcd would
				returned.Store(true)
			})
		})
		ln := &shutdownListener{conns: make(chan net.Conn, 1), closed: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ran := make(chan error, 1)
		go func() { ran <- srv.Run(ctx, ln) }()

		cli, end := net.Pipe()
		ln.conns <- end
		code := make(chan int, 1)
		go func() {
			defer cli.Close()
			if _, err := io.WriteString(cli, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				code <- -1
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(cli), nil)
			if err != nil {
				code <- -1
				return
			}
			resp.Body.Close()
			code <- resp.StatusCode
		}()
		<-entered
		cancel()
		<-cancelled
		synctest.Wait()
		select {
		case v := <-closing:
			t.Fatalf("Run closed its dependencies while the handler was running (handler returned: %v)", v)
		default:
		}
		close(release)
		if !<-closing {
			t.Fatal("Run closed its dependencies before the handler returned")
		}
		if err := <-ran; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if c := <-code; c != -1 {
			t.Fatalf("status %d, want the connection closed", c)
		}
	})
}
