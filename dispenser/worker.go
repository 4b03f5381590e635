package dispenser

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
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
		kvCfg.RenewInterval = wire.HeartbeatInterval
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

// acquireWorkerID builds this node's worker identity (workerid.Keeper) and claims its
// worker ID. From here on a failed start gives it back at once (Keeper.Release) instead
// of leaving it to a lease TTL or a session timeout. The static registry has nothing to
// give back.
func (d *Dispenser) acquireWorkerID(ctx context.Context) (err error) {
	if d.forever == nil {
		d.forever, err = workerid.OpenForever(ctx, d.js, workerid.ForeverBucket(d.cfg.Prefix), d.cfg.KVReplicas)
		if err != nil {
			return err
		}
	}
	keeper, err := workerid.NewKeeper(d.keeperConfig())
	if err != nil {
		return err
	}
	if err := keeper.Acquire(ctx); err != nil {
		return err
	}
	d.heartbeat = keeper
	d.onClose("release worker ID", func() error {
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		return keeper.Release(rctx)
	})
	return nil
}

// keeperConfig is the worker identity's configuration: the registry, the clock guard
// and heartbeat of each worker ID it holds, and the peers' range check.
func (d *Dispenser) keeperConfig() workerid.KeeperConfig {
	cfg := d.cfg
	return workerid.KeeperConfig{
		Registry:  d.registry,
		Guard:     d.guardConfig(),
		Heartbeat: d.heartbeatConfig(),
		Peers: workerid.PeersConfig{
			Conn:    d.nc,
			Service: cfg.Prefix,
			Range:   cfg.workerRange(),
			Self: func() string {
				if d.svc == nil {
					return ""
				}
				return d.svc.Info().ID
			},
			Every:     d.opts.peerCheckEvery,
			WarnEvery: d.opts.peerWarnEvery,
			Layout:    cfg.Layout().Name(),
		},
		Logger: d.log.With("component", "worker", "registry", cfg.WorkerRegistry),
	}
}

// checkClock decides whether this node's clock may be trusted with its worker ID
// (workerid.Keeper.CheckClock): the floor the generator must stay above.
func (d *Dispenser) checkClock(ctx context.Context) (err error) {
	d.floor, err = d.heartbeat.CheckClock(ctx)
	return err
}

// guardConfig is the clock guard's configuration, at start and for each worker ID taken
// after a loss.
func (d *Dispenser) guardConfig() workerid.GuardConfig {
	cfg := d.cfg
	guardCfg := workerid.DefaultGuardConfig()
	guardCfg.NodeID = cfg.NodeID
	guardCfg.Prefix = cfg.Prefix
	guardCfg.Forever = d.forever
	guardCfg.Cache = cfg.cacheFile()
	guardCfg.Conn = d.nc
	guardCfg.Clock = d.clock
	guardCfg.HeartbeatInterval = wire.HeartbeatInterval
	guardCfg.BorrowMax = cfg.clockMargin()
	guardCfg.ClockWaitMax = cfg.ClockWaitMax
	guardCfg.PeerSkewMax = cfg.PeerSkewMax
	guardCfg.Logger = d.log.With("component", "clock-guard")
	return guardCfg
}

func (d *Dispenser) newSnowflakes(context.Context) (err error) {
	d.snowflakes, err = snowflake.New(snowflake.Config{
		Layout:        d.cfg.Layout(),
		WorkerID:      d.heartbeat.WorkerID(),
		Clock:         d.clock,
		DenseSequence: d.cfg.DenseSequence,
		Floor:         d.floor,
		BorrowMax:     d.cfg.BorrowMax,
	})
	return err
}

// startHeartbeat starts the worker ID's heartbeat on the generator and writes the first
// record before serving, so the generator has a ceiling.
func (d *Dispenser) startHeartbeat(ctx context.Context) error {
	return d.heartbeat.Start(ctx, d.snowflakes)
}

// RecordInterval is how often the heartbeat writes its records: more often than Leaf's
// wire.HeartbeatInterval (which the records it writes may lag by, as PROTOCOL.md says), so
// that the ceiling it allows the generator (record + RecordInterval + --borrow-max +
// workerid.DefaultCeilingLead, in every record) is close: a node restarted after a crash
// waits at most that long past its last record before it serves (docs/operations.md).
// Records without a ceiling (earlier versions, Leaf) are still taken to allow
// wire.HeartbeatInterval.
const RecordInterval = time.Second

// heartbeatConfig is the heartbeat's configuration for every worker ID this node holds
// (the Keeper adds the lease and the generator).
func (d *Dispenser) heartbeatConfig() workerid.HeartbeatConfig {
	cfg := d.cfg
	hbCfg := workerid.DefaultHeartbeatConfig()
	hbCfg.NodeID = cfg.NodeID
	hbCfg.Forever = d.forever
	hbCfg.Cache = cfg.cacheFile()
	hbCfg.Clock = d.clock
	hbCfg.Interval = RecordInterval
	hbCfg.BorrowMax = cfg.clockMargin() // the guard waits out what the heartbeat allows
	hbCfg.ClockJumpMax = cfg.ClockJumpMax
	hbCfg.Logger = d.log.With("component", "heartbeat")
	return hbCfg
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

// workerStats is the worker keeper's part of $SRV.STATS: how many worker IDs this node
// took after its first, and why it lost the last.
func (d *Dispenser) workerStats() map[string]any {
	n, why := d.heartbeat.Rejoins()
	return map[string]any{"worker_id": d.heartbeat.WorkerID(), "rejoins": n, "last_loss": why}
}
