package etcdtest

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// Proxy forwards TCP to one etcd member until Cut, after which every
// connection is closed and new ones are dropped on accept: a network
// partition between one client and etcd (fault injection).
type Proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	isCut  bool
	wg     sync.WaitGroup
}

// StartProxy listens on loopback and forwards to targetURL's host:port
// until the test ends.
func StartProxy(t testing.TB, targetURL string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{l: l, target: strings.TrimPrefix(targetURL, "http://")}
	p.wg.Add(1)
	go p.accept() // owned by the proxy; ends when the listener closes
	t.Cleanup(func() {
		l.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "http://" + p.l.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.isCut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		d, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, d)
		p.wg.Add(2)
		go p.pipe(c, d) // both pipes end when either side closes
		go p.pipe(d, c)
		p.mu.Unlock()
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// Heal accepts and forwards connections again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.isCut = false
	p.mu.Unlock()
}

// Cut closes every forwarded connection and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// ProxyAll puts a proxy in front of every member of c and returns them with
// the endpoints that go through them.
func ProxyAll(t testing.TB, c *Cluster) ([]*Proxy, []string) {
	t.Helper()
	var proxies []*Proxy
	var urls []string
	for _, ep := range c.Endpoints {
		p := StartProxy(t, ep)
		proxies = append(proxies, p)
		urls = append(urls, p.URL())
	}
	return proxies, urls
}
