package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestClusterNodeLossNoDuplicate runs two dispensers on a 3-node JetStream cluster, each
// joined to a different node, with R3 KV buckets. Clients on every node load both kinds,
// singles and batches. The node the first dispenser (and one client) is connected to is
// shut down mid-load: every client keeps getting IDs of both kinds once it has
// reconnected, both dispensers stay in the service, and after the node is back nothing
// changes. No ID is handed out twice over the whole run.
func TestClusterNodeLossNoDuplicate(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	waitReplicatedKV(t, cluster, 3)
	nodes := cluster.Nodes

	// Each dispenser is given its own node's URL only. nats.go adds the servers that the
	// cluster announces in INFO (connect_urls) to its pool, so it fails over to the other
	// nodes without being told about them; with all URLs given it would pick one at
	// random (nats.go shuffles the list), and the test could not say which node to stop.
	var dispensers []*testDispenser
	for i := range 2 {
		dispensers = append(dispensers, startDispenser(t, func(c *testConfig) {
			c.NATS = nodes[i].URL()
			c.KVReplicas = 3
			c.NodeID = fmt.Sprintf("d%d", i+1)
		}))
	}

	// One client per node; the one on node 0 loses its server with the dispenser.
	var conns []*nats.Conn
	for _, n := range nodes {
		conns = append(conns, n.Connect(t))
	}
	load := startClusterLoad(t, conns)

	load.waitProgress(t, "before the node loss", 30, 20*time.Second)

	nodes[0].Stop()
	lost := time.Now()
	waitLog(t, dispensers[0], "NATS reconnected", 15*time.Second)
	load.waitProgress(t, "after node 0 stopped", 30, 20*time.Second)
	waitInstances(t, conns[1], "leaf", 2, 10*time.Second)
	t.Logf("clients served again %v after node 0 stopped", time.Since(lost).Round(time.Millisecond))

	nodes[0].Start()
	cluster.WaitJetStream(t, time.Now().Add(20*time.Second))
	load.waitProgress(t, "after node 0 came back", 30, 20*time.Second)
	waitInstances(t, conns[0], "leaf", 2, 10*time.Second)

	load.stop()
	load.check(t)
}

// waitReplicatedKV creates and deletes a throwaway KV bucket with the given replicas
// until that works: right after a cluster forms, the meta leader may not yet place
// replicated assets, and a dispenser starting then would fail to open its buckets.
func waitReplicatedKV(tb testing.TB, cluster *testenv.Cluster, replicas int) {
	tb.Helper()
	js, err := jetstream.New(cluster.Connect(tb))
	if err != nil {
		tb.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "warmup", Replicas: replicas})
		if err == nil {
			err = js.DeleteKeyValue(ctx, "warmup")
		}
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("R%d KV bucket not created within 20s: %v", replicas, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitLog waits until d's log holds s.
func waitLog(tb testing.TB, d *testDispenser, s string, timeout time.Duration) {
	tb.Helper()
	deadline := time.After(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(d.stderr.String(), s) {
		select {
		case <-deadline:
			tb.Fatalf("dispenser %s: no %q in its log within %v", d.cfg.NodeID, s, timeout)
		case <-tick.C:
		}
	}
}

// waitInstances waits until want instances of the service answer $SRV.PING.<name>: a
// dispenser that reconnected has its service subscriptions back.
func waitInstances(tb testing.TB, nc *nats.Conn, name string, want int, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	got := 0
	for time.Now().Before(deadline) {
		if got = countInstances(tb, nc, name); got == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("$SRV.PING.%s: %d instances answered within %v, want %d", name, got, timeout, want)
}

// countInstances pings the service and counts distinct instance IDs that answer within
// half a second.
func countInstances(tb testing.TB, nc *nats.Conn, name string) int {
	tb.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		tb.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.PING."+name, inbox, nil); err != nil {
		return 0 // reconnecting: the caller tries again
	}
	ids := map[string]bool{}
	for {
		msg, err := sub.NextMsg(500 * time.Millisecond)
		if err != nil {
			return len(ids)
		}
		var ping struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(msg.Data, &ping) == nil && ping.ID != "" {
			ids[ping.ID] = true
		}
	}
}

// clusterLoad runs, on each connection, one worker per kind that asks for singles and
// batches (up to 100) without pause, and keeps every ID.
type clusterLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ok     [][2]atomic.Int64 // successful requests per connection and kind

	mu         sync.Mutex
	seen       [2]map[int64]struct{} // per kind
	dups       []string
	unexpected []string       // replies that break the protocol, or errors that must not happen
	transient  map[string]int // failures expected while a node is down, by kind of error
}

func startClusterLoad(tb testing.TB, conns []*nats.Conn) *clusterLoad {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &clusterLoad{
		cancel:    cancel,
		ok:        make([][2]atomic.Int64, len(conns)),
		seen:      [2]map[int64]struct{}{{}, {}},
		transient: map[string]int{},
	}
	for c, nc := range conns {
		client, err := client.NewClient(nc, client.WithTimeout(time.Second))
		if err != nil {
			tb.Fatal(err)
		}
		for _, kind := range []wire.Kind{wire.Segment, wire.Snowflake} {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.work(ctx, client, c, kind, rand.New(rand.NewPCG(uint64(c), uint64(kind))))
			}()
		}
	}
	tb.Cleanup(l.stop)
	return l
}

func (l *clusterLoad) work(ctx context.Context, client *client.Client, c int, kind wire.Kind, rng *rand.Rand) {
	tag := dispenser.SampleTagName
	if kind == wire.Snowflake {
		tag = fmt.Sprintf("client%d", c)
	}
	for ctx.Err() == nil {
		n := 1
		if rng.IntN(2) == 0 {
			n = 1 + rng.IntN(100)
		}
		ids := make([]int64, n)
		err := client.Fill(ctx, kind, tag, ids)
		switch {
		case err == nil:
			l.record(c, kind, ids)
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
			errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrConnectionClosed),
			errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, wire.ErrUnavailable):
			// A request in flight on a lost route or connection times out; one sent
			// while the JetStream leaders move may be refused with 503. Neither hands
			// out an ID, so neither can cause a duplicate.
			l.mu.Lock()
			l.transient[errorClass(err)]++
			l.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		default:
			l.mu.Lock()
			l.unexpected = append(l.unexpected, fmt.Sprintf("client %d, %v: %v", c, kind, err))
			l.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func errorClass(err error) string {
	for _, e := range []error{wire.ErrUnavailable, nats.ErrNoResponders, context.DeadlineExceeded, nats.ErrTimeout} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "connection closed or reconnecting"
}

func (l *clusterLoad) record(c int, kind wire.Kind, ids []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, id := range ids {
		if i > 0 && id <= ids[i-1] {
			l.unexpected = append(l.unexpected, fmt.Sprintf("client %d, %v: reply not strictly increasing: %d after %d", c, kind, id, ids[i-1]))
		}
		if _, dup := l.seen[kind][id]; dup {
			l.dups = append(l.dups, fmt.Sprintf("%v %d", kind, id))
		}
		l.seen[kind][id] = struct{}{}
	}
	l.ok[c][kind].Add(1)
}

// waitProgress waits until every connection has had at least more successful requests
// of each kind than when it was called.
func (l *clusterLoad) waitProgress(tb testing.TB, phase string, more int64, timeout time.Duration) {
	tb.Helper()
	base := l.counts()
	deadline := time.After(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		now, done := l.counts(), true
		for c := range now {
			for k := range now[c] {
				done = done && now[c][k]-base[c][k] >= more
			}
		}
		if done {
			return
		}
		select {
		case <-deadline:
			l.mu.Lock()
			defer l.mu.Unlock()
			tb.Fatalf("%s: within %v, successful requests per client [segment snowflake] went from %v to %v, want %d more each; failures: %v; unexpected: %v",
				phase, timeout, base, now, more, l.transient, l.unexpected)
		case <-tick.C:
		}
	}
}

func (l *clusterLoad) counts() [][2]int64 {
	out := make([][2]int64, len(l.ok))
	for c := range l.ok {
		for k := range l.ok[c] {
			out[c][k] = l.ok[c][k].Load()
		}
	}
	return out
}

// stop ends the load and waits for the workers. Safe to call twice.
func (l *clusterLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *clusterLoad) check(tb testing.TB) {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	tb.Logf("IDs: %d segment, %d snowflake; transient failures: %v", len(l.seen[wire.Segment]), len(l.seen[wire.Snowflake]), l.transient)
	if len(l.dups) > 0 {
		tb.Errorf("%d IDs handed out twice, e.g. %v", len(l.dups), l.dups[:min(len(l.dups), 10)])
	}
	if len(l.unexpected) > 0 {
		tb.Errorf("%d unexpected replies, e.g. %v", len(l.unexpected), l.unexpected[:min(len(l.unexpected), 10)])
	}
}
