package workerid

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// A connection of a client that has had a session settles at go-zk's setWatches
// request, not at the handshake (its first frame, whatever its bytes) nor at another
// request; a first connection, and one after the session expired, are settled at once.
func TestZKResyncSettlesAtSetWatches(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	frame := func(xid int32, opcode uint32) []byte {
		b := make([]byte, 12)
		binary.BigEndian.PutUint32(b[0:4], 8)
		binary.BigEndian.PutUint32(b[4:8], uint32(xid))
		binary.BigEndian.PutUint32(b[8:12], opcode)
		return b
	}
	isSettled := func(z *zkResync) bool {
		select {
		case <-z.current():
			return true
		default:
			return false
		}
	}
	dial := func(z *zkResync) net.Conn {
		t.Helper()
		c, err := z.dial("tcp", ln.Addr().String(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	write := func(c net.Conn, b []byte) {
		t.Helper()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}

	z := newZKResync()
	dial(z)
	if !isSettled(z) {
		t.Fatal("a client's first connection is not settled")
	}
	z.event(zk.Event{Type: zk.EventSession, State: zk.StateHasSession})
	c := dial(z)
	if isSettled(z) {
		t.Fatal("a resumed session's connection is settled before anything was written")
	}
	write(c, frame(0, opSetWatches)) // the handshake: its bytes are no header
	write(c, frame(-2, 11))          // a ping
	write(c, frame(7, 4))            // a getData
	if isSettled(z) {
		t.Fatal("the connection is settled before the setWatches request")
	}
	write(c, frame(8, opSetWatches))
	if !isSettled(z) {
		t.Fatal("the connection is not settled after the setWatches request")
	}
	write(c, frame(9, opSetWatches)) // a second one (many watches) closes nothing twice

	z.event(zk.Event{Type: zk.EventSession, State: zk.StateExpired})
	dial(z)
	if !isSettled(z) {
		t.Fatal("the connection after an expired session (no watches left) is not settled")
	}
}
