package workerid

import (
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// zkWatchTTL is the recycle lease time of the watch tests: within the test server's
// maxSessionTimeout (20 ticks of 500 ms), and 4 heartbeats of zkWatchInterval.
const (
	zkWatchTTL      = 4 * time.Second
	zkWatchInterval = time.Second
)

func zkWatchBeat(c *HeartbeatConfig) { c.Interval = zkWatchInterval }

// A recycle lease node deleted or rewritten under its holder stops the holder within
// issue 12's 100 ms, for good.
func TestZKRecycleLeaseWatchStopsHolder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(conn *zk.Conn, p string) error
	}{
		{"deleted", func(conn *zk.Conn, p string) error { return conn.Delete(p, -1) }},
		{"rewritten by another node", func(conn *zk.Conn, p string) error {
			_, err := conn.Set(p, []byte(`{"advertise":"10.6.6.6:1","token":"not-the-holders"}`), -1)
			return err
		}},
	}
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := zkTestName(t, srv, conn)
			r := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.1:8080", zkRecycle(zkWatchTTL)))
			lease := zkAcquire(t, r)
			h := startWatchedHolder(t, lease, zkWatchBeat)
			h.waitWatched(t)

			p := r.leasePath(lease.WorkerID())
			refusalAfter(t, h.gen, ErrLeaseLost, now(func() { must(t, "change the lease node", tt.change(conn, p)) }))
			h.waitRunLost(t)
		})
	}
}

// Fail safe: in recycle mode the ID is only this node's while ZooKeeper vouches for its
// session, so a holder cut off from ZooKeeper stops at once (not at TTL/2), and issues
// again once its session is back.
func TestZKRecycleLeaseWatchDisconnected(t *testing.T) {
	t.Parallel()
	_, _, name, proxy := zkBehindProxy(t)
	r := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.1:8080", zkRecycle(zkWatchTTL)))
	h := startWatchedHolder(t, zkAcquire(t, r), zkWatchBeat)
	h.waitWatched(t)

	refusalAfter(t, h.gen, ErrLeaseUnverified, now(func() { proxy.Kill() }))
	time.Sleep(200 * time.Millisecond) // well within the session timeout
	proxy.Heal()
	start := time.Now()
	testutil.Eventually(t, 10*time.Second, "the holder to issue again", func() bool {
		_, err := h.gen.Next()
		return err == nil
	})
	t.Logf("ZooKeeper reachable again: the holder issued again %s later", time.Since(start).Round(time.Millisecond))
	if st := h.hb.Stats(); st.LeaseLost || !st.LeaseWatched {
		t.Fatalf("Stats() = %+v, want the lease kept and watched", st)
	}
	// The session resumed with the lease watch armed: go-zk set it again, and the
	// registry saw its request (zkResync) rather than waiting its bound out.
	select {
	case <-r.conn.settled():
	default:
		t.Fatalf("the resumed connection is not settled (replacements %d)", r.conn.Replaced())
	}
}

// Fail safe: a session that expired took the lease node along. The holder stays stopped
// until its renewal wrote the node again under the new session (nobody took the ID), and
// the watch saw it there; the expiry is not a loss.
func TestZKRecycleLeaseWatchSessionExpired(t *testing.T) {
	t.Parallel()
	_, conn, name, proxy := zkBehindProxy(t)
	r := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.1:8080", zkRecycle(zkWatchTTL)))
	lease := zkAcquire(t, r)
	h := startWatchedHolder(t, lease, zkWatchBeat)
	h.waitWatched(t)
	before := r.conn.SessionID()

	proxy.Kill()
	p := r.leasePath(lease.WorkerID())
	testutil.Eventually(t, 15*time.Second, "the session to expire and take the lease node", func() bool {
		ok, _, err := conn.Exists(p)
		return err == nil && !ok
	})
	proxy.Heal()
	testutil.Eventually(t, 20*time.Second, "the holder to issue again", func() bool {
		_, err := h.gen.Next()
		return err == nil
	})
	if after := r.conn.SessionID(); after == before {
		t.Fatalf("session %x did not change: it never expired", after)
	}
	if st := h.hb.Stats(); st.LeaseLost || !st.LeaseWatched {
		t.Fatalf("Stats() = %+v, want the lease kept and watched", st)
	}
}

// Leaf's layout: this node's forever node deleted stops the holder within 100 ms; its
// worker ID is that node's sequence number, and nothing holds it for this node any more.
func TestZKForeverLeaseWatchStopsHolder(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	lease := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080")))
	h := startWatchedHolder(t, lease)
	h.waitWatched(t)

	node := "/snowflake/" + name + "/forever/10.0.0.5:8080-0000000000"
	refusalAfter(t, h.gen, ErrLeaseLost, now(func() { must(t, "delete the forever node", conn.Delete(node, -1)) }))
	h.waitRunLost(t)
}

// Leaf's layout keeps issuing without ZooKeeper, as Leaf does: the worker ID is this
// node's for good, so the watch being cut off is no reason to stop.
func TestZKForeverLeaseWatchZooKeeperUnreachable(t *testing.T) {
	t.Parallel()
	_, _, name, proxy := zkBehindProxy(t)
	lease := zkAcquire(t, openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.5:8080")))
	h := startWatchedHolder(t, lease)
	h.waitWatched(t)

	proxy.Kill()
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if _, err := h.gen.Next(); err != nil {
			t.Fatalf("Next with ZooKeeper unreachable: %v, want IDs as before", err)
		}
		time.Sleep(time.Millisecond)
	}
	proxy.Heal()
	if _, err := h.gen.Next(); errors.Is(err, ErrLeaseUnverified) || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Next after ZooKeeper is back: %v", err)
	}
}

// A call made while the client has no session is handed to go-zk only once a session is
// back: go-zk would queue it and send it the moment it reconnects, while it is still
// setting its watches again (zk_registry.go, call, says why that is a data race in go-zk).
func TestZKCallWaitsForSession(t *testing.T) {
	t.Parallel()
	_, _, name, proxy := zkBehindProxy(t)
	r := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.1:8080", zkRecycle(zkWatchTTL)))
	proxy.Kill()
	testutil.Eventually(t, 10*time.Second, "the client to lose its session", func() bool { return !r.hasSession() })

	ran := make(chan zk.State, 1)
	done := make(chan error, 1)
	go func() {
		done <- r.call(testutil.Context(t, 20*time.Second), func() error {
			ran <- r.conn.State()
			_, _, err := r.conn.Exists(r.base())
			return err
		})
	}()
	select {
	case st := <-ran:
		t.Fatalf("the call was handed to go-zk without a session (state %s)", st)
	case <-time.After(300 * time.Millisecond):
	}
	proxy.Heal()
	if err := <-done; err != nil {
		t.Fatalf("the call once the session was back: %v", err)
	}
	if st := <-ran; st != zk.StateHasSession {
		t.Fatalf("the call was handed to go-zk in state %s, want %s", st, zk.StateHasSession)
	}
}
