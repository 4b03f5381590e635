package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/nats-io/nats.go"
)

// testConfig is what a test sets before a dispenser starts: what flags would fill, and
// the clock.
type testConfig struct {
	dispenser.Config
	Clock snowflake.Clock // nil: the system clock
}

// testDispenser is a running dispenser for a test, started through package dispenser
// as cmd/dispenser starts it.
type testDispenser struct {
	*dispenser.Dispenser
	cfg    dispenser.Config
	stdout *testutil.SyncBuffer // the banner
	stderr *testutil.SyncBuffer // the logs (also sent to t.Log)
	stop   func() error         // stops it and returns Run's and Close's errors
}

// startDispenser runs a dispenser on a random port in a temp dir; configure adjusts the
// defaults (as flags would) before it starts. It is stopped at cleanup.
func startDispenser(tb testing.TB, configure func(*testConfig)) *testDispenser {
	tb.Helper()
	c := testDefaults(tb, configure)
	d := &testDispenser{cfg: c.Config, stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	disp, err := newDispenser(ctx, tb, c, d.stdout, d.stderr)
	if err != nil {
		cancel()
		tb.Fatalf("dispenser did not start: %v", err)
	}
	d.Dispenser = disp
	done := make(chan error, 1)
	go func() { done <- disp.Run(ctx) }()
	var once sync.Once
	var result error
	d.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				result = errors.Join(err, disp.Close())
			case <-time.After(30 * time.Second):
				tb.Errorf("dispenser did not stop within 30s")
			}
		})
		return result
	}
	tb.Cleanup(func() {
		if err := d.stop(); err != nil {
			tb.Errorf("dispenser Run/Close: %v", err)
		}
	})
	select {
	case <-disp.Ready():
	case err := <-done:
		tb.Fatalf("dispenser stopped before it was ready: %v\nstderr:\n%s", err, d.stderr.String())
	case <-time.After(30 * time.Second):
		tb.Fatalf("dispenser not ready within 30s")
	}
	return d
}

// startErr starts a dispenser that is expected to refuse to start, and returns why.
// One that starts after all is closed again, and startErr returns nil.
func startErr(tb testing.TB, configure func(*testConfig)) error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := newDispenser(ctx, tb, testDefaults(tb, configure), io.Discard, io.Discard)
	if err != nil {
		return err
	}
	if err := d.Close(); err != nil {
		tb.Errorf("Close: %v", err)
	}
	return nil
}

// testDefaults is the configuration of a test dispenser: its own embedded NATS on a
// random port and a temp dir, then configure's changes, validated.
func testDefaults(tb testing.TB, configure func(*testConfig)) *testConfig {
	tb.Helper()
	c := &testConfig{Config: dispenser.DefaultConfig()}
	c.Listen = "127.0.0.1:0"
	c.DataDir = tb.TempDir()
	c.NodeID = "test-node"
	c.HTTP = "127.0.0.1:0" // a port of its own: tests never contend for the default
	if configure != nil {
		configure(c)
	}
	if err := c.Validate(); err != nil {
		tb.Fatalf("config: %v", err)
	}
	return c
}

// newDispenser builds a dispenser from c with its banner to stdout and its debug logs to
// stderr and t.Log. ctx must last as long as the dispenser.
func newDispenser(ctx context.Context, tb testing.TB, c *testConfig, stdout, stderr io.Writer) (*dispenser.Dispenser, error) {
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(stderr, testutil.LogWriter(tb)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := []dispenser.Option{dispenser.WithLogger(logger), dispenser.WithBanner(stdout)}
	if c.Clock != nil {
		opts = append(opts, dispenser.WithClock(c.Clock))
	}
	return dispenser.New(ctx, c.Config, opts...)
}

// connect opens a client connection to d, closed at cleanup.
func (d *testDispenser) connect(tb testing.TB) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(d.ClientURL(), nats.Timeout(5*time.Second))
	if err != nil {
		tb.Fatalf("connect to %s: %v", d.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// client is a client of d that does not hedge unless opts say so: these tests check
// exact IDs and counts, which a hedged copy on a loaded machine would shift (hedging
// itself is tested in package client and by the chaos suite).
func (d *testDispenser) client(tb testing.TB, opts ...client.ClientOption) *client.Client {
	tb.Helper()
	c, err := client.NewClient(d.connect(tb), append([]client.ClientOption{client.WithHedge(0)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// takeSnowflakes takes n snowflake IDs from d in one request, adds them to seen (failing on a repeat) and
// returns the worker ID and the highest timestamp they carry.
func takeSnowflakes(t *testing.T, d *testDispenser, seen map[int64]string, who string, n int) (workerID, maxTS int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := d.client(t)
	ids, err := c.SnowflakeN(ctx, "worker-test", n)
	if err != nil {
		t.Fatalf("%s: SnowflakeN: %v", who, err)
	}
	workerID = -1
	for _, id := range ids {
		if prev, dup := seen[id]; dup {
			t.Fatalf("snowflake ID %d from %s was already handed out by %s", id, who, prev)
		}
		seen[id] = who
	}
	for _, id := range []int64{ids[0], ids[len(ids)-1]} {
		dec, err := c.Decode(ctx, id)
		if err != nil {
			t.Fatalf("%s: Decode(%d): %v", who, id, err)
		}
		if workerID >= 0 && dec.WorkerID != workerID {
			t.Fatalf("%s: IDs of one dispenser carry worker IDs %d and %d", who, workerID, dec.WorkerID)
		}
		workerID, maxTS = dec.WorkerID, max(maxTS, dec.Timestamp)
	}
	return workerID, maxTS
}

// workerOf keeps takeSnowflakes' worker ID.
func workerOf(workerID, _ int64) int64 { return workerID }
