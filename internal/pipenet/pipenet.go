// Package pipenet is an in-memory net.Listener for tests of HTTP servers.
// Its connections are net.Pipe pairs, so a server blocked on one is
// durably blocked: it can run inside a testing/synctest bubble, where its
// read, idle and drain deadlines pass on the bubble's fake clock and
// synctest.Wait tells when nothing else can happen.
package pipenet

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
)

// Listener hands out the server ends of the connections Dial makes.
type Listener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// New returns an open Listener.
func New() *Listener {
	return &Listener{conns: make(chan net.Conn, 1), closed: make(chan struct{})}
}

// Dial returns the client end of a new connection, whose server end the
// next Accept returns.
func (l *Listener) Dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; Accept returns net.ErrClosed after it.
func (l *Listener) Close() error { l.once.Do(func() { close(l.closed) }); return nil }

// Addr implements net.Listener: a loopback address, so servers that treat
// loopback clients specially see one.
func (l *Listener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// Get sends "GET path" on a new connection from its own goroutine and
// returns a channel that receives the response's status code, or -1 when
// the connection ends without a response.
func (l *Listener) Get(path string) <-chan int {
	code := make(chan int, 1)
	conn := l.Dial()
	go func() {
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			code <- -1
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			code <- -1
			return
		}
		resp.Body.Close()
		code <- resp.StatusCode
	}()
	return code
}
