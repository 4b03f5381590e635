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

	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// freeWithin bounds how long the next taker may wait for the worker ID: far below the
// 30 s lease TTL (kv, zk recycle) and the 10 s session timeout (zk) a held ID would wait
// for. The MySQL registry's identity lock waits 2 s before refusing.
const freeWithin = 4 * time.Second

// registryCase is a worker-ID registry kind: how a dispenser is configured to use it,
// and how another taker acquires the worker ID that dispenser would hold.
type registryCase struct {
	name string
	// setup starts the registry's server and returns the configuration change and the
	// second taker (whose lease is released at cleanup).
	setup func(t *testing.T) (configure func(*Config), acquire func(ctx context.Context) (workerid.Lease, error))
}

func registryCases() []registryCase {
	return []registryCase{
		{"KV", setupKV},
		{"ZK", func(t *testing.T) (func(*Config), func(context.Context) (workerid.Lease, error)) {
			return setupZK(t, false)
		}},
		{"ZKRecycle", func(t *testing.T) (func(*Config), func(context.Context) (workerid.Lease, error)) {
			return setupZK(t, true)
		}},
		{"MySQL", setupMySQL},
	}
}

// setupKV: the dispenser joins a NATS server of the test's own, so the leases bucket
// outlives it; the next taker is another node, which gets the lowest free ID.
func setupKV(t *testing.T) (func(*Config), func(context.Context) (workerid.Lease, error)) {
	srv := testenv.StartNATS(t)
	return func(c *Config) { c.NATS = srv.URL() }, kvTaker(t, srv, DefaultConfig().Prefix)
}

// setupZK: in Leaf's layout the next taker is the same ip:port started again, which must
// not find the failed start's session still registered; in recycle mode it is another
// node, which gets the lowest free ID.
func setupZK(t *testing.T, recycle bool) (func(*Config), func(context.Context) (workerid.Lease, error)) {
	srv := testenv.ZooKeeper(t)
	name := strings.TrimPrefix(srv.NewRoot(t), "/")
	configure := func(c *Config) {
		c.WorkerRegistry, c.ZK, c.ZKName, c.ZKRecycle = "zk", srv.Addr(), name, recycle
		c.Advertise = "127.0.0.1:7101"
	}
	acquire := func(ctx context.Context) (workerid.Lease, error) {
		advertise := "127.0.0.1:7101"
		if recycle {
			advertise = "127.0.0.1:7102"
		}
		r, err := workerid.OpenZKRegistry(ctx, workerid.ZKRegistryConfig{
			Servers: srv.Servers(), Name: name, Advertise: advertise, Recycle: recycle, TTL: DefaultConfig().LeaseTTL,
		})
		if err != nil {
			return nil, err
		}
		t.Cleanup(r.Close)
		return r.Acquire(ctx)
	}
	return configure, acquire
}

// setupMySQL: the next taker is the same ip:port started again, which must get the
// identity lock (and with it the same worker ID).
func setupMySQL(t *testing.T) (func(*Config), func(context.Context) (workerid.Lease, error)) {
	dsn := testenv.MariaDB(t).NewDatabase(t)
	configure := func(c *Config) {
		c.WorkerRegistry, c.MySQLDSN, c.MySQLCreateTable = "mysql", dsn, true
		c.Advertise = "127.0.0.1:7103"
	}
	acquire := func(ctx context.Context) (workerid.Lease, error) {
		r, err := workerid.OpenMySQLRegistry(ctx, workerid.MySQLRegistryConfig{DSN: dsn, Advertise: "127.0.0.1:7103"})
		if err != nil {
			return nil, err
		}
		t.Cleanup(r.Close)
		return r.Acquire(ctx)
	}
	return configure, acquire
}

// TestFailedStartReleasesWorkerID: with each registry kind, a dispenser whose service
// cannot start (--max-batch replies would exceed the server's max_payload, found by the
// last step of the start, long after the worker ID was acquired) refuses to start, and
// the worker ID it held is free for the next taker at once.
func TestFailedStartReleasesWorkerID(t *testing.T) {
	for _, rc := range registryCases() {
		t.Run(rc.name, func(t *testing.T) {
			configure, acquire := rc.setup(t)
			cfg := testConfig(t)
			configure(&cfg)
			cfg.MaxBatch = wire.MaxBatchLimit // a text reply of 20 MB; max_payload is 1 MB
			held := int64(-1)
			_, err := newTest(t, cfg, withAfterStep(func(step string, d *Dispenser) error {
				if step == "worker ID" {
					held = d.lease.WorkerID()
				}
				return nil
			}))
			if err == nil || !strings.Contains(err.Error(), "max_payload") {
				t.Fatalf("New with --max-batch %d = %v, want the service's max_payload refusal", cfg.MaxBatch, err)
			}
			if held < 0 {
				t.Fatalf("the start failed before it acquired a worker ID: %v", err)
			}
			wantFree(t, acquire, held)
		})
	}
}

// TestFailedStartAtEveryStepReleasesWorkerID: whichever step after the worker ID fails
// (each made to fail in turn), New returns that step's error and the KV lease is free
// for the next node at once.
func TestFailedStartAtEveryStepReleasesWorkerID(t *testing.T) {
	names := stepNames()
	after := names[slices.Index(names, "worker ID"):]
	if len(after) < 2 {
		t.Fatalf("steps %v: no step named \"worker ID\" followed by others", names)
	}
	srv := testenv.StartNATS(t)
	errInjected := errors.New("injected failure")
	for i, failAt := range after {
		t.Run(strings.ReplaceAll(failAt, " ", "_"), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.NATS = srv.URL()
			cfg.Prefix = fmt.Sprintf("step%d", i) // buckets of its own
			_, err := newTest(t, cfg, withAfterStep(func(step string, _ *Dispenser) error {
				if step == failAt {
					return errInjected
				}
				return nil
			}))
			if !errors.Is(err, errInjected) {
				t.Fatalf("New failing at step %q = %v, want the injected error", failAt, err)
			}
			wantFree(t, kvTaker(t, srv, cfg.Prefix), 0)
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

func stepNames() []string {
	var names []string
	for _, s := range (&Dispenser{}).steps() {
		names = append(names, s.name)
	}
	return names
}
