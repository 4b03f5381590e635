package dispenser

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/workerid"
)

// openRegistry opens the configured worker-ID registry.
func (d *Dispenser) openRegistry(ctx context.Context) error {
	cfg := d.cfg
	switch cfg.WorkerRegistry {
	case "static":
		r, err := workerid.NewStaticRegistryInRange(cfg.WorkerID, cfg.workerRange())
		if err != nil {
			return err
		}
		d.registry = r
		return nil
	case "kv":
		kvCfg := workerid.DefaultKVRegistryConfig()
		kvCfg.Prefix = cfg.Prefix
		kvCfg.NodeID = cfg.NodeID
		kvCfg.TTL = cfg.LeaseTTL
		kvCfg.RenewInterval = HeartbeatInterval
		kvCfg.MinWorkerID, kvCfg.MaxWorkerID = cfg.WorkerIDMin, cfg.WorkerIDMax
		kvCfg.Replicas = cfg.KVReplicas
		kvCfg.Logger = d.log.With("component", "kv-registry")
		r, err := workerid.OpenKVRegistry(ctx, d.js, kvCfg)
		if err != nil {
			return fmt.Errorf("open kv worker registry: %w", err)
		}
		d.registry = r
		return nil
	}
	advertise, err := cfg.advertiseAddr()
	if err != nil {
		return err
	}
	switch cfg.WorkerRegistry {
	case "zk":
		zkCfg := workerid.DefaultZKRegistryConfig()
		zkCfg.Servers = strings.Split(cfg.ZK, ",")
		zkCfg.Name = cfg.ZKName
		zkCfg.Advertise = advertise
		zkCfg.Recycle = cfg.ZKRecycle
		zkCfg.TTL = cfg.LeaseTTL
		zkCfg.MinWorkerID, zkCfg.MaxWorkerID = cfg.WorkerIDMin, cfg.WorkerIDMax
		zkCfg.Cache = cfg.cacheFile()
		zkCfg.Logger = d.log.With("component", "zk-registry")
		r, err := workerid.OpenZKRegistry(ctx, zkCfg)
		if err != nil {
			return fmt.Errorf("open zk worker registry: %w", err)
		}
		d.registry = r
		d.onClose("zk worker registry", func() error { r.Close(); return nil })
		return nil
	case "mysql":
		myCfg := workerid.DefaultMySQLRegistryConfig()
		myCfg.DSN = cfg.MySQLDSN
		myCfg.Advertise = advertise
		myCfg.MinWorkerID, myCfg.MaxWorkerID = cfg.WorkerIDMin, cfg.WorkerIDMax
		myCfg.CreateTable = cfg.MySQLCreateTable
		myCfg.Logger = d.log.With("component", "mysql-registry")
		r, err := workerid.OpenMySQLRegistry(ctx, myCfg)
		if err != nil {
			return fmt.Errorf("open mysql worker registry: %w", err)
		}
		d.registry = r
		d.onClose("mysql worker registry", func() error { r.Close(); return nil })
		return nil
	}
	return fmt.Errorf("--worker-registry %q: want kv, zk, mysql or static", cfg.WorkerRegistry)
}

// acquireWorkerID claims this node's worker ID. From here on a failed start gives it
// back at once (releaseLease) instead of leaving it to a lease TTL or a session timeout.
// The static registry has nothing to give back.
func (d *Dispenser) acquireWorkerID(ctx context.Context) error {
	lease, err := d.registry.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a worker ID: %w", err)
	}
	d.lease = &heldLease{lease: lease} // the worker keeper replaces it after a loss (rejoin.go)
	d.onClose("release worker ID", d.releaseLease)
	d.log.Info("worker ID acquired", "worker_id", lease.WorkerID(), "registry", d.cfg.WorkerRegistry, "recorded", lease.Recorded())
	return nil
}

// checkClock decides whether this node's clock may be trusted with its worker ID: it
// refuses a clock behind the records, checks a first start against the peers, and waits
// past the floor the generator must stay above.
func (d *Dispenser) checkClock(ctx context.Context) (err error) {
	cfg := d.cfg
	d.forever, err = workerid.OpenForever(ctx, d.js, cfg.Prefix+"_forever", cfg.KVReplicas)
	if err != nil {
		return err
	}
	guard, err := d.newGuard()
	if err != nil {
		return err
	}
	if d.floor, err = guard.Start(ctx, d.lease); err != nil {
		return fmt.Errorf("clock check: %w", err)
	}
	return nil
}

// newGuard builds the clock guard, at start and for each worker ID taken after a loss.
func (d *Dispenser) newGuard() (*workerid.Guard, error) {
	cfg := d.cfg
	guardCfg := workerid.DefaultGuardConfig()
	guardCfg.NodeID = cfg.NodeID
	guardCfg.Prefix = cfg.Prefix
	guardCfg.Forever = d.forever
	guardCfg.Cache = cfg.cacheFile()
	guardCfg.Conn = d.nc
	guardCfg.Clock = d.clock
	guardCfg.HeartbeatInterval = HeartbeatInterval
	guardCfg.BorrowMax = cfg.clockMargin()
	guardCfg.ClockWaitMax = cfg.ClockWaitMax
	guardCfg.PeerSkewMax = cfg.PeerSkewMax
	guardCfg.Logger = d.log.With("component", "clock-guard")
	return workerid.NewGuard(guardCfg)
}

func (d *Dispenser) newSnowflakes(context.Context) (err error) {
	d.snowflakes, err = snowflake.New(snowflake.Config{
		Layout:        d.cfg.Layout(),
		WorkerID:      d.lease.WorkerID(),
		Clock:         d.clock,
		DenseSequence: d.cfg.DenseSequence,
		Floor:         d.floor,
		BorrowMax:     d.cfg.BorrowMax,
	})
	return err
}

// startHeartbeat builds the heartbeat, under the worker keeper that takes a new worker
// ID if this one is lost (rejoin.go), and writes the first record before serving, so
// the generator has a ceiling.
func (d *Dispenser) startHeartbeat(ctx context.Context) error {
	held, ok := d.lease.(*heldLease)
	if !ok {
		held = &heldLease{lease: d.lease}
	}
	hb, err := d.newHeartbeat(held.get())
	if err != nil {
		return err
	}
	d.heartbeat = newWorkerKeeper(d, held, hb)
	if err := hb.Beat(ctx); err != nil {
		return fmt.Errorf("first heartbeat: %w", err)
	}
	return nil
}

// RecordInterval is how often the heartbeat writes its records: more often than Leaf's
// HeartbeatInterval (which the records it writes may lag by, as PROTOCOL.md says), so
// that the ceiling it allows the generator (record + RecordInterval + --borrow-max, in
// every record) is close: a node restarted after a crash waits at most that long past
// its last record before it serves. Records without a ceiling (earlier versions, Leaf)
// are still taken to allow HeartbeatInterval.
const RecordInterval = time.Second

// newHeartbeat builds the heartbeat of lease, which suspends the generator until its
// first record is written.
func (d *Dispenser) newHeartbeat(lease workerid.Lease) (*workerid.Heartbeat, error) {
	cfg := d.cfg
	hbCfg := workerid.DefaultHeartbeatConfig()
	hbCfg.NodeID = cfg.NodeID
	hbCfg.Lease = lease
	hbCfg.Generator = d.snowflakes
	hbCfg.Forever = d.forever
	hbCfg.Cache = cfg.cacheFile()
	hbCfg.Clock = d.clock
	hbCfg.Interval = RecordInterval
	hbCfg.BorrowMax = cfg.clockMargin() // the guard waits out what the heartbeat allows
	hbCfg.ClockJumpMax = cfg.ClockJumpMax
	hbCfg.Logger = d.log.With("component", "heartbeat")
	return workerid.NewHeartbeat(hbCfg)
}

// newTimeResponder builds the answerer of <prefix>.time for the peer checks of nodes that
// start later; it subscribes when Run starts.
func (d *Dispenser) newTimeResponder(context.Context) (err error) {
	d.timeResponder, err = workerid.NewTimeResponder(d.nc, d.cfg.Prefix, d.cfg.NodeID, d.clock, d.log.With("component", "time-responder"))
	return err
}

// clockMargin is how far ahead of its clock this node's records reach (the guard and the
// heartbeat agree on it): --borrow-max, or the registries' default when borrowing is off
// (--borrow-max 0), as it always was.
func (c Config) clockMargin() time.Duration {
	if c.BorrowMax > 0 {
		return c.BorrowMax
	}
	return workerid.DefaultGuardConfig().BorrowMax
}
