package dispenser

import (
	"context"
	"fmt"
	"strings"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/workerid"
)

// openRegistry opens the configured worker-ID registry.
func (d *Dispenser) openRegistry(ctx context.Context) error {
	cfg := d.cfg
	maxID := cfg.Layout().MaxWorkerID()
	switch cfg.WorkerRegistry {
	case "static":
		r, err := workerid.NewStaticRegistry(cfg.WorkerID, maxID)
		if err != nil {
			return err
		}
		d.registry = r
		return nil
	case "kv":
		r, err := workerid.OpenKVRegistry(ctx, d.js, workerid.KVRegistryConfig{
			Prefix:        cfg.Prefix,
			NodeID:        cfg.NodeID,
			TTL:           cfg.LeaseTTL,
			RenewInterval: HeartbeatInterval,
			MaxWorkerID:   maxID,
			Replicas:      cfg.KVReplicas,
			Logger:        d.log.With("component", "kv-registry"),
		})
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
		r, err := workerid.OpenZKRegistry(ctx, workerid.ZKRegistryConfig{
			Servers:     strings.Split(cfg.ZK, ","),
			Name:        cfg.ZKName,
			Advertise:   advertise,
			Recycle:     cfg.ZKRecycle,
			TTL:         cfg.LeaseTTL,
			MaxWorkerID: maxID,
			Cache:       cfg.cacheFile(),
			Logger:      d.log.With("component", "zk-registry"),
		})
		if err != nil {
			return fmt.Errorf("open zk worker registry: %w", err)
		}
		d.registry = r
		d.onClose("zk worker registry", func() error { r.Close(); return nil })
		return nil
	case "mysql":
		r, err := workerid.OpenMySQLRegistry(ctx, workerid.MySQLRegistryConfig{
			DSN:         cfg.MySQLDSN,
			Advertise:   advertise,
			MaxWorkerID: maxID,
			CreateTable: cfg.MySQLCreateTable,
			Logger:      d.log.With("component", "mysql-registry"),
		})
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
	d.lease = lease
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
	guard, err := workerid.NewGuard(workerid.GuardConfig{
		NodeID:            cfg.NodeID,
		Prefix:            cfg.Prefix,
		Forever:           d.forever,
		Cache:             cfg.cacheFile(),
		Conn:              d.nc,
		Clock:             d.clock,
		HeartbeatInterval: HeartbeatInterval,
		BorrowMax:         cfg.BorrowMax,
		ClockWaitMax:      cfg.ClockWaitMax,
		PeerSkewMax:       cfg.PeerSkewMax,
		Logger:            d.log.With("component", "clock-guard"),
	})
	if err != nil {
		return err
	}
	if d.floor, err = guard.Start(ctx, d.lease); err != nil {
		return fmt.Errorf("clock check: %w", err)
	}
	return nil
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

// startHeartbeat builds the heartbeat and writes the first record before serving, so the
// generator has a ceiling.
func (d *Dispenser) startHeartbeat(ctx context.Context) (err error) {
	cfg := d.cfg
	d.heartbeat, err = workerid.NewHeartbeat(workerid.HeartbeatConfig{
		NodeID:       cfg.NodeID,
		Lease:        d.lease,
		Generator:    d.snowflakes,
		Forever:      d.forever,
		Cache:        cfg.cacheFile(),
		Clock:        d.clock,
		Interval:     HeartbeatInterval,
		BorrowMax:    cfg.BorrowMax,
		ClockJumpMax: cfg.ClockJumpMax,
		Logger:       d.log.With("component", "heartbeat"),
	})
	if err != nil {
		return err
	}
	if err := d.heartbeat.Beat(ctx); err != nil {
		return fmt.Errorf("first heartbeat: %w", err)
	}
	return nil
}

// newTimeResponder builds the answerer of <prefix>.time for the peer checks of nodes that
// start later; it subscribes when Run starts.
func (d *Dispenser) newTimeResponder(context.Context) (err error) {
	d.timeResponder, err = workerid.NewTimeResponder(d.nc, d.cfg.Prefix, d.cfg.NodeID, d.clock, d.log.With("component", "time-responder"))
	return err
}
