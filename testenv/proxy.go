package testenv

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on a random loopback port in front of one server address, for
// tests that need a process's connections to behave as if the process froze or died
// while the process itself (a goroutine set in the test binary) goes on: Pause stops
// every byte both ways, as SIGSTOP would; Resume lets the held bytes through; Kill
// resets every connection at once and refuses new ones, as kill -9 would.
type Proxy struct {
	tb     testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	resumed chan struct{} // nil while running; closed by Resume
	killed  bool
	wg      sync.WaitGroup
}

// StartProxy starts a proxy to target (host:port) and stops it at cleanup.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testenv: proxy listen: %v", err)
	}
	p := &Proxy{tb: tb, ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// URL is the proxy's address as a NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.Addr() }

// Addr is the proxy's host:port, for clients of other servers (ZooKeeper, MySQL).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.killed {
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// pipe copies src to dst, holding each chunk while the proxy is paused.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitRunning()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: closing both ends passes it on
		}
	}
}

func (p *Proxy) waitRunning() {
	p.mu.Lock()
	ch := p.resumed
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// Pause holds every byte in both directions until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed == nil {
		p.resumed = make(chan struct{})
	}
}

// Resume lets the held bytes through and the connections run again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
}

// Kill resets every connection (no goodbye, as when a process is killed) and refuses
// every new one.
func (p *Proxy) Kill() {
	p.mu.Lock()
	p.killed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.Resume()
	for c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}

// Heal ends a Kill: new connections reach the target again, as when a network
// partition ends or a killed server is back.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killed = false
}

func (p *Proxy) close() {
	p.Kill()
	p.ln.Close()
	p.wg.Wait()
}

// String names the proxy in test logs.
func (p *Proxy) String() string { return fmt.Sprintf("proxy %s -> %s", p.ln.Addr(), p.target) }
