package dispenser

// A start that fails after the worker ID was acquired gives it back at once (issue 10):
// for each registry kind, the ID is free for the next taker well within the lease TTL
// or session timeout that would otherwise hold it. The static registry has nothing to
// give back (its ID is a flag, held by no one), so it has no test here.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// freeWithin bounds how long the next taker may wait for the worker ID: far below the
// 30 s lease TTL (kv, zk recycle) and the 10 s session timeout (zk) a held ID would wait
// for. The MySQL registry's identity lock waits 2 s before refusing.
const freeWithin = 4 * time.Second

// registryCase is a worker-ID registry kind: how a dispenser is configured to use it
// (setup starts the registry's server), and how the next taker of its worker ID is
// configured, given the dispenser's configuration.
type registryCase struct {
	name  string
	setup func(t *testing.T) func(*Config)
	taker func(Config) Config
}

func registryCases() []registryCase {
	return []registryCase{
		// The dispenser joins a NATS server of the test's own, so the leases bucket
		// outlives it; the next taker is another node, which gets the lowest free ID.
		{"KV", func(t *testing.T) func(*Config) {
			srv := testenv.StartNATS(t)
			return func(c *Config) { c.NATS = srv.URL() }
		}, otherNode},
		// In Leaf's layout the next taker is the same ip:port started again, which must
		// not find the failed start's session still registered.
		{"ZK", func(t *testing.T) func(*Config) { return zkSetup(t, false) }, sameNode},
		// In recycle mode the next taker is another node, which gets the lowest free ID.
		{"ZKRecycle", func(t *testing.T) func(*Config) { return zkSetup(t, true) }, otherNode},
		// The next taker is the same ip:port started again, which must get the identity
		// lock, and with it the same worker ID.
		{"MySQL", func(t *testing.T) func(*Config) {
			dsn := testenv.MariaDB(t).NewDatabase(t)
			return func(c *Config) {
				c.WorkerRegistry, c.MySQLDSN, c.MySQLCreateTable = "mysql", dsn, true
				c.Advertise = "127.0.0.1:7103"
			}
		}, sameNode},
	}
}

func zkSetup(t *testing.T, recycle bool) func(*Config) {
	srv := testenv.ZooKeeper(t)
	name := strings.TrimPrefix(srv.NewRoot(t), "/")
	return func(c *Config) {
		c.WorkerRegistry, c.ZK, c.ZKName, c.ZKRecycle = "zk", srv.Addr(), name, recycle
		c.Advertise = "127.0.0.1:7101"
	}
}

func sameNode(c Config) Config { return c }

func otherNode(c Config) Config {
	c.NodeID, c.Advertise = "next-taker", "127.0.0.1:7102"
	return c
}

// nextTaker acquires a worker ID as a node configured with cfg would, through the
// dispenser's own registry set-up; that registry is closed at cleanup.
func nextTaker(t *testing.T, cfg Config) func(context.Context) (workerid.Lease, error) {
	return func(ctx context.Context) (workerid.Lease, error) {
		d := &Dispenser{cfg: cfg, log: testutil.Logger(t)}
		t.Cleanup(func() { _ = d.Close() })
		if cfg.NATS != "" {
			nc, err := nats.Connect(cfg.NATS)
			if err != nil {
				return nil, err
			}
			d.onClose("NATS connection", func() error { nc.Close(); return nil })
			if d.js, err = jetstream.New(nc); err != nil {
				return nil, err
			}
		}
		if err := d.openRegistry(ctx); err != nil {
			return nil, err
		}
		return d.registry.Acquire(ctx)
	}
}

// TestFailedStartReleasesWorkerID: with each registry kind, a dispenser whose service
// cannot start (--max-batch replies would exceed the server's max_payload, found by the
// last step of the start, long after the worker ID was acquired) refuses to start, and
// the worker ID it held is free for the next taker at once.
func TestFailedStartReleasesWorkerID(t *testing.T) {
	for _, rc := range registryCases() {
		t.Run(rc.name, func(t *testing.T) {
			cfg := testConfig(t)
			rc.setup(t)(&cfg)
			cfg.MaxBatch = wire.MaxBatchLimit // a text reply of 20 MB; max_payload is 1 MB
			held := int64(-1)
			_, err := newTest(t, cfg, withAfterStep(func(step stepName, d *Dispenser) error {
				if step == stepWorkerID {
					held = d.heartbeat.WorkerID()
				}
				return nil
			}))
			if err == nil || !strings.Contains(err.Error(), "max_payload") {
				t.Fatalf("New with --max-batch %d = %v, want the service's max_payload refusal", cfg.MaxBatch, err)
			}
			if held < 0 {
				t.Fatalf("the start failed before it acquired a worker ID: %v", err)
			}
			wantFree(t, nextTaker(t, rc.taker(cfg)), held)
		})
	}
}

// TestFailedStartAtEveryStepReleasesWorkerID: whichever step after the worker ID fails
// (each made to fail in turn), New returns that step's error and the KV lease is free
// for the next node at once.
func TestFailedStartAtEveryStepReleasesWorkerID(t *testing.T) {
	names := stepNames()
	after := names[slices.Index(names, stepWorkerID):]
	if len(after) < 2 {
		t.Fatalf("steps %v: no step named \"worker ID\" followed by others", names)
	}
	srv := testenv.StartNATS(t)
	errInjected := errors.New("injected failure")
	for i, failAt := range after {
		t.Run(strings.ReplaceAll(string(failAt), " ", "_"), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.NATS = srv.URL()
			cfg.Prefix = fmt.Sprintf("step%d", i) // buckets of its own
			_, err := newTest(t, cfg, withAfterStep(func(step stepName, _ *Dispenser) error {
				if step == failAt {
					return errInjected
				}
				return nil
			}))
			if !errors.Is(err, errInjected) {
				t.Fatalf("New failing at step %q = %v, want the injected error", failAt, err)
			}
			wantFree(t, nextTaker(t, otherNode(cfg)), 0)
		})
	}
}

// wantFree acquires with acquire within freeWithin, checks it got worker ID want, and
// returns the lease (released at cleanup).
func wantFree(t *testing.T, acquire func(context.Context) (workerid.Lease, error), want int64) workerid.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), freeWithin)
	defer cancel()
	start := time.Now()
	lease, err := acquire(ctx)
	if err != nil {
		t.Fatalf("the next taker could not acquire a worker ID within %v after the failed start: %v", freeWithin, err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background(), lease.Recorded()) })
	if got := lease.WorkerID(); got != want {
		t.Fatalf("the next taker got worker ID %d, want %d: the failed start still holds it", got, want)
	}
	t.Logf("worker ID %d free again, acquired in %v", want, time.Since(start).Round(time.Millisecond))
	return lease
}

func stepNames() []stepName {
	var names []stepName
	for _, s := range (&Dispenser{}).steps() {
		names = append(names, s.name)
	}
	return names
}
