package main

// Issue 21's worker-ID mistakes of a fleet, tried as an operator would, with real
// dispenser processes (the binary) on a testenv NATS server and ZooKeeper.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
)

// binSnowflakes takes n snowflake IDs from the dispensers on url in one request and
// returns them with the worker ID they carry.
func binSnowflakes(t *testing.T, url string, n int) ([]int64, int64) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	defer nc.Close()
	c, err := client.NewClient(nc, client.WithHedge(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids, err := c.SnowflakeN(ctx, "fleet", n)
	if err != nil {
		t.Fatalf("SnowflakeN: %v", err)
	}
	dec, err := snowflake.DefaultLayout().Decode(ids[0])
	if err != nil {
		t.Fatalf("Decode(%d): %v", ids[0], err)
	}
	return ids, dec.WorkerID
}

// TestRegistrySwitchWhileZKDown is issue 21's "registry switch while ZooKeeper is down":
// a node that ran with --worker-registry kv is restarted with --worker-registry zk while
// ZooKeeper is unreachable. Its cache file holds the worker ID the KV registry leased,
// which the KV registry will hand to another node; the restart must refuse to start
// from it, saying why, instead of issuing with it.
func TestRegistrySwitchWhileZKDown(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := testenv.StartNATS(t)
	zk := testenv.StartZooKeeper(t)
	zkAddr := zk.Addr()
	zk.Stop()
	dir := t.TempDir()
	common := []string{"--nats", srv.URL(), "--node-id", "disp-1", "--http", ""}

	kv := startBinary(t, dir, append(common, "--worker-registry", "kv")...)
	_, worker := binSnowflakes(t, srv.URL(), 1000)
	stopBinary(t, kv)

	code, stderr, took := runToExit(t, 30*time.Second, nil, append(common, "--data-dir", dir,
		"--worker-registry", "zk", "--zk", zkAddr, "--advertise", "127.0.0.1:7101", "--start-timeout", "3s")...)
	t.Logf("exit %d after %v:\n%s", code, took.Round(time.Millisecond), stderr)
	if code == 0 {
		t.Fatal("the restart with --worker-registry zk exited 0, want a refusal")
	}
	last := lastLine(stderr)
	for _, want := range []string{
		fmt.Sprintf("holds worker ID %d from registry \"kv leaf_leases\", not this one (\"zk /snowflake/leafbus\")", worker),
		"start with ZooKeeper reachable",
	} {
		if !strings.Contains(last, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, last)
		}
	}
}
