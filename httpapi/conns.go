package httpapi

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The connection cap. Every open HTTP connection costs a file descriptor and some 20
// KB (a goroutine, net/http's buffers), so the HTTP face holds at most MaxConns. At the
// cap a new connection takes the place of the one that has waited longest without a
// request in progress (idle between keep-alive requests, or not done sending its first
// request's header): 10,000 keep-alive connections someone left open, or a slowloris'
// half-sent headers, are closed for clients that want an answer. When every connection
// has a request in progress, the new one is answered 503 and closed at once, and the
// node reports itself saturated on /readyz. The first time the cap bites it is logged,
// then at most once a minute with what it did since.

// connCapLogEvery is how often the cap's work is logged while it bites.
const connCapLogEvery = time.Minute

// connCap tracks the HTTP face's open connections and enforces MaxConns.
type connCap struct {
	max  int
	log  *slog.Logger
	mono func() time.Duration // Server.mono
	// refused is called for each connection refused (the saturation mark, metrics).
	refused func()

	closedIdle, refusedTotal atomic.Int64 // since the start, for metrics
	// order numbers connections' waits: a lower since started waiting earlier. A
	// counter, not a clock: ConnState runs twice a request, and a clock read costs.
	order atomic.Int64

	mu    sync.Mutex
	conns map[*capConn]struct{}
	// What the cap did since it was last logged, and when that was (0: never).
	loggedAt                time.Duration
	sinceIdle, sinceRefused int
	everLogged              bool
}

func newConnCap(max int, log *slog.Logger, mono func() time.Duration, refused func()) *connCap {
	return &connCap{max: max, log: log, mono: mono, refused: refused, conns: make(map[*capConn]struct{}, min(max, 1024))}
}

// open is how many connections are open.
func (c *connCap) open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// capConn is an accepted connection the cap tracks. Its state is net/http's
// (Server.ConnState), and since when it waits.
type capConn struct {
	net.Conn
	cap   *connCap
	state atomic.Int32 // http.ConnState
	since atomic.Int64 // connCap.order when it was accepted or last became idle
	gone  atomic.Bool  // untracked (closed, or closed by the cap)
}

// Close closes the connection and stops tracking it.
func (c *capConn) Close() error {
	c.cap.forget(c)
	return c.Conn.Close()
}

// CloseWrite keeps net/http's graceful close (a FIN after the answer, then a short wait
// for the client to read it) through the wrapper.
func (c *capConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// waiting reports whether the connection has no request in progress: idle between
// requests, or not done sending its first request's header. Those are the ones the cap
// may close.
func (c *capConn) waiting() bool {
	st := http.ConnState(c.state.Load())
	return st == http.StateNew || st == http.StateIdle
}

func (c *connCap) forget(cc *capConn) {
	if cc.gone.Swap(true) {
		return
	}
	c.mu.Lock()
	delete(c.conns, cc)
	c.mu.Unlock()
}

// connState is the http.Server's ConnState hook: it keeps each connection's state.
func (c *connCap) connState(nc net.Conn, st http.ConnState) {
	cc, ok := nc.(*capConn)
	if !ok {
		return
	}
	cc.state.Store(int32(st))
	switch st {
	case http.StateIdle:
		cc.since.Store(c.order.Add(1))
	case http.StateClosed, http.StateHijacked:
		c.forget(cc)
	}
}

// admit tracks nc when there is room, making room by closing the connection that has
// waited longest without a request in progress; it returns nil when there is none to
// close, and then nc is the caller's to refuse.
func (c *connCap) admit(nc net.Conn) *capConn {
	cc := &capConn{Conn: nc, cap: c}
	cc.state.Store(int32(http.StateNew))
	cc.since.Store(c.order.Add(1))
	c.mu.Lock()
	var victim *capConn
	if len(c.conns) >= c.max {
		for o := range c.conns {
			if o.waiting() && (victim == nil || o.since.Load() < victim.since.Load()) {
				victim = o
			}
		}
		if victim == nil {
			c.sinceRefused++
			c.noteLocked(c.mono())
			c.mu.Unlock()
			c.refusedTotal.Add(1)
			return nil
		}
		delete(c.conns, victim)
		victim.gone.Store(true)
		c.sinceIdle++
		c.noteLocked(c.mono())
	}
	c.conns[cc] = struct{}{}
	c.mu.Unlock()
	if victim != nil {
		c.closedIdle.Add(1)
		victim.Conn.Close() //nolint:errcheck // net/http's read on it ends, and it cleans up
	}
	return cc
}

// noteLocked logs what the cap did: at once the first time, then at most every
// connCapLogEvery, with the counts since the last line. c.mu is held.
func (c *connCap) noteLocked(now time.Duration) {
	if c.everLogged && now-c.loggedAt < connCapLogEvery {
		return
	}
	if !c.everLogged {
		c.log.Warn(fmt.Sprintf("http: %d connections open, the cap (--http-max-conns): a new connection closes the one idle longest (between requests, or still sending its first header), and is refused with 503 when every one has a request in progress; logged again at most every %s while it lasts",
			c.max, connCapLogEvery), "max_conns", c.max)
	} else {
		c.log.Warn(fmt.Sprintf("http: at the connection cap in the last %s", (now-c.loggedAt).Round(time.Second)),
			"max_conns", c.max, "idle_closed", c.sinceIdle, "refused", c.sinceRefused)
	}
	c.everLogged, c.loggedAt, c.sinceIdle, c.sinceRefused = true, now, 0, 0
}

// capRefusal is what a connection refused at the cap reads before it is closed.
var capRefusal = rawAnswer(http.StatusServiceUnavailable, "unavailable: too many HTTP connections open\n")

// rawAnswer is a whole HTTP/1.1 answer with body, closing the connection.
func rawAnswer(code int, body string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// capListener is a listener whose Accept admits connections within the cap and
// refuses the rest.
type capListener struct {
	net.Listener
	cap *connCap
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if cc := l.cap.admit(nc); cc != nil {
			return cc, nil
		}
		// A fresh socket takes these bytes without blocking; the deadline is a guard.
		_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = nc.Write(capRefusal)
		nc.Close() //nolint:errcheck // refused
		l.cap.refused()
	}
}
