package dispenser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// step is one stage of New. A step that builds something that must be undone registers
// the undo with onClose as soon as it exists.
type step struct {
	name stepName
	run  func(ctx context.Context) error
}

// stepName names a stage of New: in logs ("step"), in the start's waits and hints
// (startwait.go), and in the admin commands' partial starts (admin.go).
type stepName string

// The stages of New, in the order steps runs them.
const (
	stepDataDir            stepName = "data dir"
	stepFence              stepName = "fence"
	stepEpoch              stepName = "epoch"
	stepIDKey              stepName = "id key"
	stepMySQL              stepName = "mysql"
	stepNATS               stepName = "nats"
	stepSegmentMarks       stepName = "segment marks"
	stepSegmentStore       stepName = "segment store"
	stepWorkerRegistry     stepName = "worker registry"
	stepSnowflakeLayout    stepName = "snowflake layout"
	stepDeployment         stepName = "deployment"
	stepSegmentTags        stepName = "segment tags"
	stepStoreCheck         stepName = "segment store check"
	stepRestoreCheck       stepName = "restore check"
	stepSegmentGenerator   stepName = "segment generator"
	stepWorkerID           stepName = "worker ID"
	stepClockCheck         stepName = "clock check"
	stepSnowflakeGenerator stepName = "snowflake generator"
	stepHeartbeat          stepName = "heartbeat"
	stepTimeResponder      stepName = "time responder"
	stepMonotonic          stepName = "monotonic tags"
	stepMonotonicRecord    stepName = "monotonic tags in the record"
	stepPools              stepName = "pools"
	stepCore               stepName = "core"
	stepMetrics            stepName = "metrics"
	stepService            stepName = "service"
	stepHTTP               stepName = "http"
)

// steps lists the stages of New in order. From "worker ID" on, this node holds a worker
// ID, which Close gives back if a later stage fails.
func (d *Dispenser) steps() []step {
	return []step{
		{stepDataDir, d.lockDataDir},     // first: nothing may open the dir before it is ours
		{stepFence, d.checkFencePending}, // fence.go: an interrupted fence must be finished first
		{stepEpoch, d.checkEpoch},
		{stepIDKey, d.loadIDKey}, // idkey.go
		{stepMySQL, d.checkMySQL},
		{stepNATS, d.startNATS},
		{stepSegmentMarks, d.openMarks},
		{stepSegmentStore, d.openSegmentStore},
		{stepWorkerRegistry, d.openRegistry},
		{stepSnowflakeLayout, d.checkPeerLayouts}, // before the deployment record: a refused start writes none
		{stepDeployment, d.checkDeployment},       // deployment.go: before anything is created, taken or served
		{stepSegmentTags, d.createTags},
		{stepStoreCheck, d.checkStoreMarks},
		{stepRestoreCheck, d.checkRestore}, // datadir.go
		{stepSegmentGenerator, d.newSegments},
		{stepWorkerID, d.acquireWorkerID},
		{stepClockCheck, d.checkClock},
		{stepSnowflakeGenerator, d.newSnowflakes},
		{stepHeartbeat, d.startHeartbeat},
		{stepTimeResponder, d.newTimeResponder},
		{stepMonotonic, d.newMonotonic},                // monotonic.go: before the pools, which refuse its tags
		{stepMonotonicRecord, d.restoreMonotonicMarks}, // deployment.go
		{stepPools, d.newPools},
		{stepCore, d.newCore},
		{stepMetrics, d.newMetrics},
		{stepService, d.startService},
		{stepHTTP, d.startHTTP},
	}
}

// checkPeerLayouts refuses to start beside a live dispenser of another snowflake layout,
// seen through $SRV: the deployment record holds the layout too, but a fleet of
// dispensers from before the record (and the flag: Leaf's layout) wrote none.
func (d *Dispenser) checkPeerLayouts(ctx context.Context) error {
	return workerid.CheckPeerLayouts(ctx, d.nc, d.cfg.Prefix, d.cfg.Layout().Name(), "")
}

// startNATS starts the embedded server (or not, with --nats) and opens the connection the
// store, registry, clock records and heartbeats use.
func (d *Dispenser) startNATS(context.Context) error {
	cfg := d.cfg
	d.clientURL = cfg.NATS
	if cfg.NATS == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
			return fmt.Errorf("create --data-dir: %w", err)
		}
		e, err := bus.StartEmbedded(bus.EmbeddedConfig{
			Listen: cfg.Listen, DataDir: cfg.DataDir, Monitor: cfg.Monitor, Name: cfg.NodeID, Logger: d.log,
			ConfigFile: cfg.NATSConfig, InsecureListen: cfg.InsecureListen, IsLoopback: d.opts.loopback,
		})
		if err != nil {
			return err
		}
		d.embedded, d.clientURL = e, e.ClientURL()
		d.onClose("embedded NATS server", func() error { e.Shutdown(); return nil })
	}
	nc, err := d.connect("leafbus " + cfg.NodeID)
	if err != nil {
		return err
	}
	d.nc = nc
	d.onClose("NATS connection", func() error { nc.Close(); return nil })
	if d.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	return nil
}

// connect opens a connection named name with the configured credentials: in process to
// the embedded server, or to --nats (auth.go). A permissions violation on it while New
// runs ends the start (startwait.go).
func (d *Dispenser) connect(name string) (*nats.Conn, error) {
	return d.connectAs(name, Credentials{}, d.denied.option())
}

// openSegmentStore opens the configured store. Nothing is created in it before the
// deployment check (createTags).
func (d *Dispenser) openSegmentStore(ctx context.Context) error {
	cfg := d.cfg
	if cfg.SegmentStore == "mysql" {
		store, err := segment.OpenMySQLStore(ctx, segment.MySQLConfig{
			DSN:         cfg.MySQLDSN,
			CreateTable: cfg.MySQLCreateTable,
			Logger:      d.log.With("component", "mysql-store"),
		})
		if err != nil {
			return fmt.Errorf("open mysql segment store: %w", err)
		}
		d.onClose("mysql segment store", store.Close)
		d.store = store
	} else {
		store, err := segment.OpenKVStore(ctx, d.js, wire.Subjects{Prefix: cfg.Prefix}.Bucket(wire.BucketSegments), cfg.KVReplicas)
		if err != nil {
			return fmt.Errorf("open segment store: %w", err)
		}
		d.store = store
	}
	return nil
}

// createTags creates the sample tag (with the KV store, in a data dir never used for
// segments: datadir.go) and the tags of WithTags when they do not exist yet, once the
// deployment check has passed: a dispenser that does not belong to the deployment
// creates nothing in a store of its own (the sample tag at max_id 1 in a KV bucket
// beside a MySQL deployment's leaf_alloc).
func (d *Dispenser) createTags(ctx context.Context) error {
	cfg := d.cfg
	if cfg.SegmentStore != "mysql" {
		if cfg.SampleTag && !d.freshDataDir {
			d.noSampleTag(ctx)
		} else if cfg.SampleTag {
			sample := segment.Tag{Name: SampleTagName, Step: SampleTagStep, MaxID: 1, Description: "Leaf's sample tag"}
			if err := d.ensureTag(ctx, sample, "sample tag"); err != nil {
				return err
			}
		}
	}
	for _, t := range d.opts.tags {
		if err := d.ensureTag(ctx, t, "tag"); err != nil {
			return err
		}
	}
	if d.opts.wrapStore != nil {
		d.store = d.opts.wrapStore(d.store)
	}
	return nil
}

// ensureTag creates t unless the store has it.
func (d *Dispenser) ensureTag(ctx context.Context, t segment.Tag, what string) error {
	_, err := d.store.AddTag(ctx, t)
	switch {
	case err == nil:
		d.log.Info(what+" created", "tag", t.Name, "step", t.Step)
	case errors.Is(err, segment.ErrTagExists):
	default:
		return fmt.Errorf("create %s %q: %w", what, t.Name, err)
	}
	return nil
}

func (d *Dispenser) newSegments(context.Context) (err error) {
	segCfg := segment.DefaultConfig()
	segCfg.Store, segCfg.Logger = d.store, d.log.With("component", "segment")
	segCfg.Marks = d.marks
	d.segments, err = segment.New(segCfg)
	return err
}

// newPools builds the pre-filled replies for requests of exactly a pool's size (--pool)
// and the JetStream stream that keeps the same pools for bulk (ETL) jobs.
func (d *Dispenser) newPools(context.Context) (err error) {
	cfg := d.cfg
	batchCfg := pools.DefaultConfig()
	batchCfg.Specs = cfg.Pools
	// A pool never holds a monotonic tag; its batches have their tag's range.
	ordinary := core.NewOrdinary(d.segments, d.mono, d.shaper)
	batchCfg.Segments = ordinary
	batchCfg.Snowflakes = d.snowflakes
	batchCfg.Logger = d.log.With("component", "pools")
	if d.batches, err = pools.New(batchCfg); err != nil {
		return err
	}
	streamCfg := pools.DefaultStreamConfig()
	streamCfg.JetStream = d.js
	streamCfg.Prefix = cfg.Prefix
	streamCfg.Specs = cfg.Pools
	streamCfg.Segments = ordinary
	// Batches a pool stored before its tag was marked monotonic are purged, not left for
	// a job to take after IDs the leader has handed out since.
	streamCfg.Excluded = ordinary.Excluded
	streamCfg.Snowflakes = d.snowflakes
	streamCfg.Replicas = cfg.KVReplicas
	streamCfg.Logger = d.log.With("component", "pool-stream")
	d.poolStream, err = pools.NewStream(streamCfg)
	return err
}

// newCore builds what every request means, for both faces: the monotonic tags' leaders,
// the pools, the segment buffers and the snowflake generator, with one bound on waiting.
func (d *Dispenser) newCore(context.Context) (err error) {
	cfg := d.cfg
	cc := core.DefaultConfig()
	cc.MaxBatch = cfg.MaxBatch
	cc.Layout = cfg.Layout()
	cc.Segments = d.segments
	cc.Snowflakes = d.snowflakes
	cc.Monotonic = d.mono
	cc.Record = deploymentRecord{d} // deployment.go: the record follows a mark and a range
	cc.Tags = d.store
	cc.Shaper, cc.TagRanges = d.shaper, d.mono
	if len(cfg.Pools) > 0 {
		cc.Batches = d.batches
	}
	cc.Logger = d.log.With("component", "core")
	d.core, err = core.New(cc)
	return err
}

// startService starts the NATS service ($SRV-discoverable). It gets a connection of its own: stopping it
// drains every request already delivered, while heartbeats still use the first one to
// write the last record.
func (d *Dispenser) startService(context.Context) error {
	cfg := d.cfg
	svcConn, err := d.connectAs("leafbus service "+cfg.NodeID, cfg.ServiceAuth)
	if err != nil {
		return err
	}
	d.onClose("service connection", func() error { svcConn.Close(); return nil })
	svcCfg := bus.DefaultConfig()
	svcCfg.Prefix = cfg.Prefix
	svcCfg.Version = d.build.Semver()
	svcCfg.Core = d.core
	svcCfg.Stats = d.endpointStats
	svcCfg.Logger = d.log.With("component", "service")
	svcCfg.Observer = d.metrics
	// What discovery and the peers' worker-ID range check read (worker_range.go).
	svcCfg.Metadata = map[string]string{
		wire.MetaNodeID:      cfg.NodeID,
		wire.MetaWorkerIDMin: strconv.FormatInt(cfg.WorkerIDMin, 10),
		wire.MetaWorkerIDMax: strconv.FormatInt(cfg.WorkerIDMax, 10),
		wire.MetaBuild:       d.build.String(),
		wire.MetaDeployment:  d.own.Meta(), // what this dispenser is: deployment.LivePeers
	}
	layout := cfg.Layout()
	svcCfg.Metadata[wire.MetaSnowflakeLayout] = layout.Name()
	svcCfg.Metadata[wire.MetaSnowflakeWorkers] = strconv.FormatInt(layout.MaxWorkerID()+1, 10)
	svcCfg.Metadata[wire.MetaSnowflakePerMs] = strconv.FormatInt(layout.MaxSequence()+1, 10)
	svcCfg.Metadata[wire.MetaDeploymentRecord] = strconv.Itoa(wire.DeploymentVersion)
	// The worker ID is asked for each answer: after a lost lease the worker keeper moves
	// the generator to a new one, and discovery and the peers must see that one.
	svcCfg.LiveMetadata = func() map[string]string {
		return map[string]string{wire.MetaWorkerID: strconv.FormatInt(d.snowflakes.WorkerID(), 10)}
	}
	svc, err := bus.New(svcConn, svcCfg)
	if err != nil {
		return err
	}
	d.svc = svc
	d.onClose("service", svc.Stop)
	return d.checkServicePermissions(svcConn)
}
