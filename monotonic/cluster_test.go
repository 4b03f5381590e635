package monotonic

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestClusterNodeRestart: three dispensers on a 3-node NATS cluster with R3 buckets;
// the NATS node the leader is connected to restarts under load. Connections move to
// the other nodes, the tag answers again, and the promise holds throughout. The node
// stays down for 1.5 x TTL, longer than the leader may go without renewing.
func TestClusterNodeRestart(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	e := &env{t: t, urls: cluster.URLs(), prefix: "mono", replicas: 3, ttl: 2 * time.Second, renew: 250 * time.Millisecond, log: true}
	_, leader, clients := start3(e, false, 50)
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	wait := rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 12, 5)
	time.Sleep(time.Second)

	name := leader.nc.ConnectedServerName()
	var restarted *testenv.NATS
	for _, n := range cluster.Nodes {
		if fmt.Sprint(n.Server().Name()) == name {
			restarted = n
		}
	}
	if restarted == nil {
		t.Fatalf("leader %s is connected to %q, not a node of the cluster", leader.name, name)
	}
	at := rec.since()
	t.Logf("restarting NATS node %s, the leader's (%s), down for 1.5 x TTL", name, leader.name)
	restarted.Stop()
	time.Sleep(3 * e.ttl / 2)
	restarted.Start()
	cluster.WaitJetStream(t, time.Now().Add(20*time.Second))
	back := rec.since()
	time.Sleep(3 * e.ttl)
	cancel()
	wait()
	t.Log(rec.summary())
	rec.check(t)
	if _, ok := rec.answeredAfter(back); !ok {
		t.Fatalf("no answer after NATS node %s came back: %s", name, rec.summary())
	}
	t.Logf("node down and back in %v; longest time without an answer from then on: %v", back-at, rec.longestGap(at))
}
