package workerid

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
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

// A registry call on an unsettled connection waits for it to settle, or for zkResyncMax
// when it never does (no watch to set again): never before either.
func TestZKCallWaitsForResync(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	name := zkTestName(t, srv, srv.Connect(t))
	r := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.1:8080"))
	ctx := testutil.Context(t, 30*time.Second)
	if !r.waitSession(ctx, 10*time.Second) {
		t.Fatal("no ZooKeeper session")
	}
	unsettle := func() chan struct{} {
		r.conn.mu.RLock()
		z := r.conn.resync
		r.conn.mu.RUnlock()
		z.mu.Lock()
		defer z.mu.Unlock()
		z.settled = make(chan struct{})
		return z.settled
	}
	call := func() (began time.Time, ran <-chan time.Time) {
		out := make(chan time.Time, 1)
		began = time.Now()
		go func() { _ = r.call(ctx, func() error { out <- time.Now(); return nil }) }()
		return began, out
	}

	settled := unsettle()
	began, ran := call()
	select {
	case at := <-ran:
		if d := at.Sub(began); d < zkResyncMax {
			t.Fatalf("the call ran %v after it was made, on an unsettled connection", d)
		}
		t.Log("the machine stalled past the bound before the connection was settled: nothing to tell")
	case <-time.After(zkResyncMax / 5):
		close(settled)
		select {
		case <-ran:
		case <-ctx.Done():
			t.Fatal("the call did not run once the connection settled")
		}
	}

	unsettle() // never settled: the bound lets the call go on
	began, ran = call()
	select {
	case at := <-ran:
		if d := at.Sub(began); d < zkResyncMax {
			t.Fatalf("the call ran %v after it was made, before the bound %v", d, zkResyncMax)
		}
	case <-ctx.Done():
		t.Fatal("the call never ran on a connection that never settled")
	}
}
