package bus

import (
	"bytes"
	"net"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
)

// handshakeWrites is how many writes nats.go makes to open a connection: CONNECT, then
// PING, each a write of its own.
const handshakeWrites = 2

// inProcessServer hands nats.go in-process connections to the embedded server whose
// handshake cannot deadlock (handshakeConn).
type inProcessServer struct{ srv *server.Server }

func (p inProcessServer) InProcessConn() (net.Conn, error) {
	c, err := p.srv.InProcessConn()
	if err != nil {
		return nil, err
	}
	return newHandshakeConn(c), nil
}

// handshakeConn is the client end of an in-process connection whose first writes do
// not wait for the server. Over net.Pipe a write returns only once the other end has
// read it, and a server that refuses the credentials in CONNECT writes its -ERR instead
// of reading the PING that follows: each end would wait for the other until the
// server's write deadline (10 s), and nats.go would report a closed pipe instead of the
// refusal. So the first handshakeWrites writes are queued to a goroutine; later writes
// wait until the queue has been written (at once, in practice: the server has read the
// PING by the time it answers PONG) and then go straight to the pipe.
type handshakeConn struct {
	net.Conn
	mu      sync.Mutex
	queued  int
	queue   chan []byte
	drained chan struct{} // closed when the queue is written, or failed
	err     error         // why the queue failed; read only after drained
}

func newHandshakeConn(c net.Conn) *handshakeConn {
	h := &handshakeConn{Conn: c, queue: make(chan []byte, handshakeWrites), drained: make(chan struct{})}
	go h.writeQueue()
	return h
}

func (h *handshakeConn) writeQueue() {
	defer close(h.drained)
	for p := range h.queue {
		if h.err != nil {
			continue // keep receiving until the queue is closed
		}
		_, h.err = h.Conn.Write(p)
	}
}

func (h *handshakeConn) Write(p []byte) (int, error) {
	h.mu.Lock()
	if h.queued < handshakeWrites {
		h.queued++
		h.queue <- bytes.Clone(p) // never blocks: the buffer holds every queued write
		if h.queued == handshakeWrites {
			close(h.queue)
		}
		h.mu.Unlock()
		return len(p), nil
	}
	h.mu.Unlock()
	<-h.drained
	if h.err != nil {
		return 0, h.err
	}
	return h.Conn.Write(p)
}

// Close closes the pipe, which also ends a queued write still waiting for the server.
func (h *handshakeConn) Close() error {
	h.mu.Lock()
	if h.queued < handshakeWrites {
		h.queued = handshakeWrites
		close(h.queue)
	}
	h.mu.Unlock()
	return h.Conn.Close()
}
