package workerid

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// go-zk (go-zookeeper/zk v1.0.4, conn.go) resumes a session on a new connection and
// then sets the session's watches again (sendSetWatches), reading its last-seen zxid
// while its receive loop already writes it for every answer, without a lock between
// them (go-zookeeper/zk#35, open since 2020). The value is a word, so nothing breaks,
// but the race detector reports it, and it did in a fresh-clone `make test`.
// Registry calls wait for a session (awaitSession), so the only answers that meet it
// are to calls made just as the session comes back. zkResync closes that: on a
// connection that resumed a session whose watches may be armed, calls wait until
// go-zk has written its request that sets them again (it reads the zxid before it
// queues that request, so a call made after it follows the read), or zkResyncMax when
// none comes (no watch was armed). zkFrameConn also orders each write before the reads
// that follow it, so that the receive loop handling an answer follows the request.

// zkResyncMax bounds a call's wait for go-zk's setWatches request after a resumed
// session: it is queued within microseconds when there are watches to set, and never
// when there are none.
const zkResyncMax = 250 * time.Millisecond

// opSetWatches is the ZooKeeper protocol's opcode of the request that sets a resumed
// session's watches again (go-zk's constant is unexported).
const opSetWatches = 101

// zkResync follows one go-zk client's connections (its Dialer and event callback).
type zkResync struct {
	mu      sync.Mutex
	armed   bool          // the client has had a session, whose watches may be armed
	settled chan struct{} // closed once calls may use the current connection
}

func newZKResync() *zkResync {
	z := &zkResync{settled: make(chan struct{})}
	close(z.settled)
	return z
}

// dial is the client's zk.Dialer: a connection of a client that has had a session
// starts unsettled.
func (z *zkResync) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	z.settled = make(chan struct{})
	if !z.armed {
		close(z.settled)
	}
	return &zkFrameConn{Conn: c, settled: z.settled}, nil
}

// event sees the client's session events: an expired session took its watches along.
func (z *zkResync) event(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	switch ev.State {
	case zk.StateHasSession:
		z.armed = true
	case zk.StateExpired:
		z.armed = false
	}
}

// current is the channel closed once calls may use the current connection.
func (z *zkResync) current() <-chan struct{} {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.settled
}

// zkFrameConn is a connection of a go-zk client. go-zk writes each frame in one Write:
// the first is the session handshake, any later one whose opcode is setWatches settles
// the connection.
type zkFrameConn struct {
	net.Conn
	settled chan struct{}

	order  sync.Mutex // a write releases it before the bytes go out, a read takes it after they came
	frames int        // frames written, under order
}

func (c *zkFrameConn) Write(b []byte) (int, error) {
	c.order.Lock()
	c.frames++
	if c.frames > 1 && len(b) >= 12 && binary.BigEndian.Uint32(b[8:12]) == opSetWatches {
		select {
		case <-c.settled:
		default:
			close(c.settled)
		}
	}
	c.order.Unlock()
	return c.Conn.Write(b)
}

func (c *zkFrameConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.order.Lock() // an empty section: only the ordering after earlier writes is wanted
	c.order.Unlock()
	return n, err
}
