package workerid

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

func TestZKRecycleRace(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	var regs []*ZKRegistry
	for i := range 10 {
		r := openZK(t, zkConfig(srv.Servers(), name, fmt.Sprintf("10.0.0.%d:8080", i), zkRecycle(4*time.Second)))
		if !r.waitSession(testutil.Context(t, 10*time.Second), 10*time.Second) {
			t.Fatal("no session")
		}
		regs = append(regs, r)
	}
	seen := map[int64]bool{}
	for _, id := range raceAcquire(t, regs) {
		if seen[id] {
			t.Fatalf("worker ID %d leased twice", id)
		}
		if id < 0 || id > 9 {
			t.Fatalf("worker ID %d, want the lowest free ones 0..9", id)
		}
		seen[id] = true
	}
}

// A silent holder's ID goes to another node once its session expired (TTL); the new
// holder starts past the old one's last report and the old holder's Renew says lost.
func TestZKRecycleExpiry(t *testing.T) {
	t.Parallel()
	srv, conn, name, proxy := zkBehindProxy(t)
	const ttl = 2 * time.Second

	a := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.1:8080", zkRecycle(ttl)))
	la := zkAcquire(t, a)
	if la.TTL() != ttl {
		t.Fatalf("TTL %s, want %s", la.TTL(), ttl)
	}
	ctx := testutil.Context(t, 30*time.Second)
	lastReport := time.Now().UnixMilli()
	must(t, "Renew", la.Renew(ctx, lastReport))

	proxy.Kill()
	leasePath := a.leasePath(la.WorkerID())
	testutil.Eventually(t, 10*time.Second, "the silent holder's lease node to expire", func() bool {
		ok, _, err := conn.Exists(leasePath)
		return err == nil && !ok
	})
	b := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.2:8080", zkRecycle(ttl)))
	lb := zkAcquire(t, b)
	if lb.WorkerID() != la.WorkerID() {
		t.Fatalf("new holder got worker ID %d, want the expired %d", lb.WorkerID(), la.WorkerID())
	}
	if lb.Recorded() < lastReport {
		t.Fatalf("new holder's Recorded %d, want >= the previous holder's last report %d", lb.Recorded(), lastReport)
	}

	proxy.Heal()
	var err error
	testutil.Eventually(t, 15*time.Second, "the old holder's Renew to report the lease lost", func() bool {
		err = la.Renew(ctx, time.Now().UnixMilli())
		return errors.Is(err, ErrLeaseLost)
	})
	// The old holder's failed renewals never lowered nor took over the new holder's record.
	must(t, "new holder Renew", lb.Renew(ctx, time.Now().UnixMilli()))
}

// A holder cut off from ZooKeeper is suspended by its heartbeat (at TTL/2) while the
// lease node still exists, i.e. before anyone else could be given the ID.
func TestZKRecycleHeartbeatSuspendsBeforeExpiry(t *testing.T) {
	t.Parallel()
	_, conn, name, proxy := zkBehindProxy(t)
	const ttl = 2 * time.Second

	r := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.1:8080", zkRecycle(ttl)))
	lease := zkAcquire(t, r)
	gen := &fakeGen{}
	hb, err := newHeartbeat(heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "n1"
		c.Lease = lease
		c.Generator = gen
		c.Interval = 250 * time.Millisecond
		c.WriteTimeout = 200 * time.Millisecond
		c.Logger = testutil.Logger(t)
	}))
	must(t, "newHeartbeat", err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hb.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("heartbeat Run did not return")
		}
	})
	testutil.Eventually(t, 5*time.Second, "the first beat to resume the generator", func() bool {
		_, s := gen.state()
		return s == nil
	})

	proxy.Kill()
	testutil.Eventually(t, 5*time.Second, "the heartbeat to suspend the generator", func() bool {
		_, s := gen.state()
		return errors.Is(s, ErrLeaseLost)
	})
	ok, st, err := conn.Exists(r.leasePath(lease.WorkerID()))
	must(t, "Exists", err)
	if !ok {
		t.Fatal("the lease node had already expired when the generator was suspended")
	}
	if st.EphemeralOwner == 0 {
		t.Fatal("lease node is not ephemeral")
	}
}
