package leader_test

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// proxy forwards TCP to one etcd member until cut, after which every
// connection is closed and new ones are dropped on accept: a network
// partition between one client and etcd (fault injection).
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	isCut  bool
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, targetURL string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: strings.TrimPrefix(targetURL, "http://")}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		l.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) url() string { return "http://" + p.l.Addr().String() }

func (p *proxy) accept() {
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
		go p.pipe(c, d)
		go p.pipe(d, c)
		p.mu.Unlock()
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// heal accepts and forwards connections again.
func (p *proxy) heal() {
	p.mu.Lock()
	p.isCut = false
	p.mu.Unlock()
}

// cut closes every forwarded connection and refuses new ones.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// proxyAll puts a proxy in front of every member of c and returns them with
// the endpoints that go through them.
func proxyAll(t *testing.T, c *cluster) ([]*proxy, []string) {
	t.Helper()
	var proxies []*proxy
	var urls []string
	for _, ep := range c.Endpoints {
		p := startProxy(t, ep)
		proxies = append(proxies, p)
		urls = append(urls, p.url())
	}
	return proxies, urls
}
