package dispenser

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/workerid"
)

// A dispenser started while its NATS cluster has no JetStream quorum (two of three nodes
// still down, as when the cluster starts together with it) waits for it, logging why,
// instead of refusing at the first "no responders" (issue 13).
func TestStartWaitsForJetStream(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	cluster.Nodes[1].Stop()
	cluster.Nodes[2].Stop()
	cfg := testConfig(t)
	cfg.NATS = cluster.URLs()
	cfg.KVReplicas = 3
	cfg.StartTimeout = time.Minute

	started := make(chan struct{})
	go func() {
		defer close(started)
		time.Sleep(2 * time.Second)
		cluster.Nodes[1].Start()
		cluster.Nodes[2].Start()
	}()
	begin := time.Now()
	d, err := newTest(t, cfg)
	<-started
	if err != nil {
		t.Fatalf("New while JetStream forms: %v", err)
	}
	if waited := time.Since(begin); waited < 2*time.Second {
		t.Fatalf("New returned after %s, before the cluster had a quorum", waited)
	}
	runTest(t, d)

	// With no time to wait, the same start refuses at once.
	cluster.Nodes[1].Stop()
	cluster.Nodes[2].Stop()
	cfg.NodeID, cfg.DataDir, cfg.StartTimeout = "impatient", t.TempDir(), 0
	begin = time.Now()
	if _, err := newTest(t, cfg); err == nil {
		t.Fatalf("New without a JetStream quorum and --start-timeout 0 succeeded")
	}
	t.Logf("--start-timeout 0 refused after %s", time.Since(begin).Round(time.Millisecond))
}

// A refusal for safety is never waited out: a clock behind this node's record refuses at
// once, however long --start-timeout is.
func TestStartDoesNotWaitOutRefusals(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	cfg.StartTimeout = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	forever, err := workerid.OpenForever(ctx, js, cfg.Prefix+"_forever", 1)
	if err != nil {
		t.Fatalf("OpenForever: %v", err)
	}
	ahead := time.Now().Add(time.Hour).UnixMilli()
	if err := forever.Put(ctx, cfg.NodeID, workerid.Record{WorkerID: 0, Timestamp: ahead}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	begin := time.Now()
	_, err = newTest(t, cfg)
	if !errors.Is(err, workerid.ErrClockBehindRecord) {
		t.Fatalf("New with the clock an hour behind its record = %v, want ErrClockBehindRecord", err)
	}
	if d := time.Since(begin); d > 10*time.Second {
		t.Fatalf("refused after %s, want at once", d)
	}
}
