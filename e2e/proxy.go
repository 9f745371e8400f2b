package e2e

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a small TCP load balancer on loopback standing in for the one an
// operator puts in front of several replicas: each new connection goes to
// the next backend in turn that accepts it (a dead backend refuses the dial
// and is skipped), and a connection whose backend dies is dropped, so the
// client reconnects and lands on a survivor.
type Proxy struct {
	Addr, URL string

	ln       net.Listener
	backends []string
	next     atomic.Uint64

	mu         sync.Mutex // guards the following
	conns      map[net.Conn]struct{}
	perBackend map[string]int // connections handed to each backend
}

// StartProxy listens on a free loopback port and balances over backends
// (host:port); it stops when the test ends.
func StartProxy(t testing.TB, backends ...string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, backends: backends, conns: map[net.Conn]struct{}{}, perBackend: map[string]int{}}
	p.URL = "http://" + p.Addr
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// SetBackends replaces the backends (for servers started after the proxy).
func (p *Proxy) SetBackends(backends ...string) {
	p.mu.Lock()
	p.backends = append([]string(nil), backends...)
	p.mu.Unlock()
}

// Connections answers how many connections each backend was handed.
func (p *Proxy) Connections() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.perBackend {
		out[k] = v
	}
	return out
}

// Close stops listening and drops every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

func (p *Proxy) handle(client net.Conn) {
	p.track(client, true)
	defer p.track(client, false)
	defer client.Close()
	p.mu.Lock()
	backends := append([]string(nil), p.backends...)
	p.mu.Unlock()
	if len(backends) == 0 {
		return
	}
	start := p.next.Add(1)
	var upstream net.Conn
	var chosen string
	for i := range backends {
		b := backends[(int(start)+i)%len(backends)]
		c, err := net.DialTimeout("tcp", b, 2*time.Second)
		if err == nil {
			upstream, chosen = c, b
			break
		}
	}
	if upstream == nil {
		return // no backend alive: the client sees the connection close
	}
	p.track(upstream, true)
	defer p.track(upstream, false)
	defer upstream.Close()
	p.mu.Lock()
	p.perBackend[chosen]++
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(upstream, client)
	go pipe(client, upstream)
	<-done // either side ended: drop both, as a balancer drops a dead backend's connections
}
