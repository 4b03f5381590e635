package dispenser

import (
	"context"
	"testing"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/nats-io/nats.go"
)

// TestMain stops the shared MariaDB and ZooKeeper that tests of this package start.
func TestMain(m *testing.M) { testenv.Main(m) }

// testConfig is the default configuration on a random port in a temp dir.
func testConfig(tb testing.TB) Config {
	tb.Helper()
	c := DefaultConfig()
	c.Listen = "127.0.0.1:0"
	c.DataDir = tb.TempDir()
	c.NodeID = "test-node"
	c.HTTP = "127.0.0.1:0" // a port of its own: tests never contend for the default
	return c
}

// newTest is New with the logs going to t.Log, bounded by a minute. A dispenser that
// starts is closed at cleanup.
func newTest(tb testing.TB, cfg Config, opts ...Option) (*Dispenser, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := New(ctx, cfg, append([]Option{WithLogger(testutil.Logger(tb))}, opts...)...)
	if err == nil {
		tb.Cleanup(func() {
			if err := d.Close(); err != nil {
				tb.Errorf("Close: %v", err)
			}
		})
	}
	return d, err
}

// withAfterStep sets the tests' hook that runs after each step of New.
func withAfterStep(f func(step stepName, d *Dispenser) error) Option {
	return func(o *options) error {
		o.afterStep = f
		return nil
	}
}

// exactClient connects to d and returns the connection and a client that does not
// hedge: tests that count requests or expect exact IDs would see a hedged copy on a
// loaded machine as a second request. Both close at cleanup.
func exactClient(tb testing.TB, d *Dispenser) (*nats.Conn, *client.Client) {
	tb.Helper()
	nc, err := nats.Connect(d.ClientURL())
	if err != nil {
		tb.Fatalf("connect to %s: %v", d.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	c, err := client.NewClient(nc, client.WithHedge(0))
	if err != nil {
		tb.Fatal(err)
	}
	return nc, c
}
