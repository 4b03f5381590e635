package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/run"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/service"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// Main is one dispenser: it parses its configuration, runs until a signal, its
// context or a fatal error stops it, and cleans up. Tests run the real code path
// through it on a random port (Listen "127.0.0.1:0") in a temp dir.
type Main struct {
	Config Config
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	Clock  snowflake.Clock // nil: the system clock; tests inject a skewed one

	ready     chan struct{}
	clientURL string
	closers   []func() // stores and registries, closed when Run returns
}

// NewMain returns a Main with the defaults, writing to the process's stdout/stderr.
func NewMain() *Main {
	return &Main{
		Config: defaultConfig(),
		Stdout: os.Stdout,
		Stderr: os.Stderr,
		Getenv: os.Getenv,
		ready:  make(chan struct{}),
	}
}

// ParseFlags reads the command line and the environment, and validates the result.
func (m *Main) ParseFlags(args []string) error {
	return m.Config.parse(args, m.Getenv, m.Stderr)
}

// Ready is closed once the dispenser answers requests.
func (m *Main) Ready() <-chan struct{} { return m.ready }

// ClientURL is the NATS URL the dispenser serves on (valid after Ready).
func (m *Main) ClientURL() string { return m.clientURL }

// Run builds the parts, then runs them as one oklog/run group until the first one
// stops. A clean stop (signal or ctx) returns nil.
func (m *Main) Run(ctx context.Context) (err error) {
	cfg := m.Config
	logger := cfg.logger(m.Stderr).With("node", cfg.NodeID)
	clock := m.Clock
	if clock == nil {
		clock = snowflake.SystemClock()
	}
	// Until the group runs, whatever was built is closed here if a later step fails;
	// the stores and registries are closed last in any case.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
		for i := len(m.closers) - 1; i >= 0; i-- {
			m.closers[i]()
		}
		m.closers = nil
	}()

	// NATS: embedded by default, or an existing deployment.
	var embedded *dispenser.Embedded
	connect := func(name string) (*nats.Conn, error) {
		c := cfg.Conn
		c.URLs, c.Name = cfg.NATS, name
		return c.Connect(logger)
	}
	if cfg.NATS == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
			return fmt.Errorf("create --data-dir: %w", err)
		}
		embedded, err = dispenser.StartEmbedded(dispenser.EmbeddedConfig{
			Listen: cfg.Listen, DataDir: cfg.DataDir, Monitor: cfg.Monitor, Name: cfg.NodeID, Logger: logger,
		})
		if err != nil {
			return err
		}
		undo = append(undo, embedded.Shutdown)
		m.clientURL = embedded.ClientURL()
		connect = func(name string) (*nats.Conn, error) { return embedded.Connect(nats.Name(name)) }
	} else {
		m.clientURL = cfg.NATS
	}
	nc, err := connect("leafbus " + cfg.NodeID)
	if err != nil {
		return err
	}
	undo = append(undo, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}

	// Segments.
	store, err := m.openSegmentStore(ctx, js, logger)
	if err != nil {
		return err
	}
	segCfg := segment.DefaultConfig()
	segCfg.Store, segCfg.Logger = store, logger.With("component", "segment")
	segments, err := segment.New(segCfg)
	if err != nil {
		return err
	}

	// Snowflake: who this node is, whether its clock may be trusted, then the generator.
	registry, err := m.openRegistry(ctx, js, logger)
	if err != nil {
		return err
	}
	lease, err := registry.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a worker ID: %w", err)
	}
	logger.Info("worker ID acquired", "worker_id", lease.WorkerID(), "registry", cfg.WorkerRegistry, "recorded", lease.Recorded())
	forever, err := workerid.OpenForever(ctx, js, cfg.Prefix+"_forever", cfg.KVReplicas)
	if err != nil {
		return err
	}
	cache := m.cacheFile()
	guard, err := workerid.NewGuard(workerid.GuardConfig{
		NodeID:            cfg.NodeID,
		Prefix:            cfg.Prefix,
		Forever:           forever,
		Cache:             cache,
		Conn:              nc,
		Clock:             clock,
		HeartbeatInterval: heartbeatInterval,
		BorrowMax:         cfg.BorrowMax,
		ClockWaitMax:      cfg.ClockWaitMax,
		PeerSkewMax:       cfg.PeerSkewMax,
		Logger:            logger.With("component", "clock-guard"),
	})
	if err != nil {
		return err
	}
	floor, err := guard.Start(ctx, lease)
	if err != nil {
		// Give an expiring worker ID back at once rather than after a whole TTL.
		releaseCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if rerr := lease.Release(releaseCtx, lease.Recorded()); rerr != nil {
			logger.Warn("release worker ID after failed start", "worker_id", lease.WorkerID(), "err", rerr)
		}
		return fmt.Errorf("clock check: %w", err)
	}
	snowflakes, err := snowflake.New(snowflake.Config{
		Layout:        cfg.layout(),
		WorkerID:      lease.WorkerID(),
		Clock:         clock,
		DenseSequence: cfg.DenseSequence,
		Floor:         floor,
		BorrowMax:     cfg.BorrowMax,
	})
	if err != nil {
		return err
	}
	heartbeat, err := workerid.NewHeartbeat(workerid.HeartbeatConfig{
		NodeID:       cfg.NodeID,
		Lease:        lease,
		Generator:    snowflakes,
		Forever:      forever,
		Cache:        cache,
		Clock:        clock,
		Interval:     heartbeatInterval,
		BorrowMax:    cfg.BorrowMax,
		ClockJumpMax: cfg.ClockJumpMax,
		Logger:       logger.With("component", "heartbeat"),
	})
	if err != nil {
		return err
	}
	// The first record is written before serving, so the generator has a ceiling.
	if err := heartbeat.Beat(ctx); err != nil {
		return fmt.Errorf("first heartbeat: %w", err)
	}
	timeResponder, err := workerid.NewTimeResponder(nc, cfg.Prefix, cfg.NodeID, clock, logger.With("component", "time-responder"))
	if err != nil {
		return err
	}

	// The service gets a connection of its own: stopping it drains every request
	// already delivered, while heartbeats still use nc to write the last record.
	svcConn, err := connect("leafbus service " + cfg.NodeID)
	if err != nil {
		return err
	}
	undo = append(undo, svcConn.Close)
	svcCfg := service.DefaultConfig()
	svcCfg.Prefix = cfg.Prefix
	svcCfg.MaxBatch = cfg.MaxBatch
	svcCfg.Layout = cfg.layout()
	svcCfg.Segments = segments
	svcCfg.Snowflakes = snowflakes
	svcCfg.Tags = store
	svcCfg.Logger = logger.With("component", "service")
	// Pre-filled replies for requests of exactly a pool's size (--pool).
	batches, err := pools.New(pools.Config{
		Specs:      cfg.Pools,
		Segments:   segments,
		Snowflakes: snowflakes,
		Logger:     logger.With("component", "pools"),
	})
	if err != nil {
		return err
	}
	if len(cfg.Pools) > 0 {
		svcCfg.Batches = batches
	}
	// The same pools, kept in the JetStream stream for bulk (ETL) jobs.
	poolStream, err := pools.NewStream(pools.StreamConfig{
		JetStream:  js,
		Prefix:     cfg.Prefix,
		Specs:      cfg.Pools,
		Segments:   segments,
		Snowflakes: snowflakes,
		Replicas:   cfg.KVReplicas,
		Logger:     logger.With("component", "pool-stream"),
	})
	if err != nil {
		return err
	}
	svcCfg.Stats = func(endpoint string) any {
		switch endpoint {
		case "segment":
			return map[string]any{"tags": segments.Stats(), "pools": ofKind(batches.Stats(), wire.Segment, poolKind), "pool_stream": ofKind(poolStream.Stats(), wire.Segment, streamKind)}
		case "snowflake":
			return map[string]any{"generator": generatorStats(snowflakes.Stats()), "clock": heartbeat.Stats(), "pools": ofKind(batches.Stats(), wire.Snowflake, poolKind), "pool_stream": ofKind(poolStream.Stats(), wire.Snowflake, streamKind)}
		}
		return nil
	}
	svc, err := service.New(svcConn, svcCfg)
	if err != nil {
		return err
	}

	// Every part runs as one actor. Interrupts run in this order, each waiting for its
	// part to finish: stop serving (answering what was delivered), stop loading
	// segments, write the last heartbeat record, then shut NATS down.
	var g run.Group
	g.Add(run.SignalHandler(ctx, os.Interrupt, syscall.SIGTERM))
	{
		stopped := make(chan struct{})
		g.Add(func() error {
			<-stopped
			return nil
		}, func(error) {
			if err := svc.Stop(); err != nil {
				logger.Warn("service stop", "err", err)
			}
			select {
			case <-stopped:
			default:
				close(stopped)
			}
		})
	}
	addLoop(&g, "segment loader", segments.Run)
	// The pools fill once the tag list is in; before, every segment fill would fail.
	addLoop(&g, "batch pools", afterReady(segments.Ready(), batches.Run))
	addLoop(&g, "pool stream", afterReady(segments.Ready(), poolStream.Run))
	addLoop(&g, "heartbeat", heartbeat.Run)
	addLoop(&g, "time responder", timeResponder.Run)
	addLoop(&g, "announcer", func(ctx context.Context) error { return m.announce(ctx, segments, logger) })
	{
		stop := make(chan struct{})
		g.Add(func() error {
			<-stop
			return nil
		}, func(error) {
			close(stop)
			nc.Close()
			if embedded != nil {
				embedded.Shutdown()
			}
		})
	}
	err = g.Run()
	switch {
	case errors.Is(err, run.ErrSignal):
		logger.Info("stopped", "reason", err.Error())
		return nil
	case errors.Is(err, context.Canceled), err == nil:
		logger.Info("stopped")
		return nil
	}
	return err
}

// addLoop adds a background loop to g, stopped by cancelling its context; the interrupt
// returns once the loop has. A loop that ends by itself stops the dispenser with an
// error that names it, never a silent clean exit.
func addLoop(g *run.Group, name string, loop func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	g.Add(func() error {
		defer close(done)
		err := loop(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped by itself")
		}
		return fmt.Errorf("%s: %w", name, err)
	}, func(error) {
		cancel()
		<-done
	})
}

// afterReady runs loop once ready is closed and keeps running until ctx ends, also when
// loop returns at once (pools with nothing configured).
func afterReady(ready <-chan struct{}, loop func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil
		}
		if err := loop(ctx); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
}

// generatorStats shows the snowflake generator in $SRV.STATS: how far its clock is
// behind (a step back), how far it borrowed ahead, and how many requests it refused.
func generatorStats(s snowflake.Stats) map[string]any {
	return map[string]any{
		"issued":          s.Issued,
		"borrowed_ms":     s.Borrowed.Milliseconds(),
		"clock_offset_ms": s.Offset.Milliseconds(),
		"refused":         s.Refused,
	}
}

func poolKind(s pools.PoolStats) string     { return s.Kind }
func streamKind(s pools.StreamStats) string { return s.Kind }

// ofKind keeps the pool stats of one kind for $SRV.STATS (an empty list when none).
func ofKind[S any](all []S, kind wire.Kind, kindOf func(S) string) []S {
	out := []S{}
	for _, s := range all {
		if kindOf(s) == kind.String() {
			out = append(out, s)
		}
	}
	return out
}

// announce waits until the segment tags are loaded, then says how to ask for an ID.
// It stays running until stopped, so that it is an actor like the others.
func (m *Main) announce(ctx context.Context, segments *segment.Generator, logger *slog.Logger) error {
	select {
	case <-segments.Ready():
	case <-ctx.Done():
		return nil
	}
	cfg := m.Config
	logger.Info("serving", "nats", m.clientURL, "prefix", cfg.Prefix, "segment_store", cfg.SegmentStore, "worker_registry", cfg.WorkerRegistry)
	server := ""
	if m.clientURL != "nats://127.0.0.1:4222" {
		server = " --server " + m.clientURL
	}
	fmt.Fprintf(m.Stdout, `leafbus is serving on %s. Ask for IDs with the nats CLI:
  nats%s req %s.segment.%s ""
  nats%s req %s.snowflake.any ""
  nats%s req %s.segment.%s 5      (five IDs)
`, m.clientURL, server, cfg.Prefix, sampleTag, server, cfg.Prefix, server, cfg.Prefix, sampleTag)
	close(m.ready)
	<-ctx.Done()
	return nil
}

// openSegmentStore opens the configured store and, with the KV store, makes sure the
// sample tag exists so the first request of a newcomer works.
func (m *Main) openSegmentStore(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) (segment.Store, error) {
	cfg := m.Config
	if cfg.SegmentStore == "mysql" {
		store, err := segment.OpenMySQLStore(ctx, segment.MySQLConfig{
			DSN:         cfg.MySQLDSN,
			CreateTable: cfg.MySQLCreateTable,
			Logger:      logger.With("component", "mysql-store"),
		})
		if err != nil {
			return nil, fmt.Errorf("open mysql segment store: %w", err)
		}
		m.closers = append(m.closers, func() { store.Close() })
		return store, nil
	}
	store, err := segment.OpenKVStore(ctx, js, cfg.Prefix+"_segments", cfg.KVReplicas)
	if err != nil {
		return nil, fmt.Errorf("open segment store: %w", err)
	}
	if cfg.SampleTag {
		_, err := store.AddTag(ctx, segment.Tag{Name: sampleTag, Step: sampleTagStep, MaxID: 1, Description: "Leaf's sample tag"})
		switch {
		case err == nil:
			logger.Info("sample tag created", "tag", sampleTag, "step", sampleTagStep)
		case errors.Is(err, segment.ErrTagExists):
		default:
			return nil, fmt.Errorf("create sample tag %q: %w", sampleTag, err)
		}
	}
	return store, nil
}

// openRegistry opens the configured worker-ID registry.
func (m *Main) openRegistry(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) (workerid.Registry, error) {
	cfg := m.Config
	layout := cfg.layout()
	switch cfg.WorkerRegistry {
	case "static":
		return workerid.NewStaticRegistry(cfg.WorkerID, layout.MaxWorkerID())
	case "kv":
		r, err := workerid.OpenKVRegistry(ctx, js, workerid.KVRegistryConfig{
			Prefix:        cfg.Prefix,
			NodeID:        cfg.NodeID,
			TTL:           cfg.LeaseTTL,
			RenewInterval: heartbeatInterval,
			MaxWorkerID:   layout.MaxWorkerID(),
			Replicas:      cfg.KVReplicas,
			Logger:        logger.With("component", "kv-registry"),
		})
		if err != nil {
			return nil, fmt.Errorf("open kv worker registry: %w", err)
		}
		return r, nil
	}
	advertise, err := cfg.advertiseAddr()
	if err != nil {
		return nil, err
	}
	switch cfg.WorkerRegistry {
	case "zk":
		r, err := workerid.OpenZKRegistry(ctx, workerid.ZKRegistryConfig{
			Servers:     strings.Split(cfg.ZK, ","),
			Name:        cfg.ZKName,
			Advertise:   advertise,
			Recycle:     cfg.ZKRecycle,
			TTL:         cfg.LeaseTTL,
			MaxWorkerID: layout.MaxWorkerID(),
			Cache:       m.cacheFile(),
			Logger:      logger.With("component", "zk-registry"),
		})
		if err != nil {
			return nil, fmt.Errorf("open zk worker registry: %w", err)
		}
		m.closers = append(m.closers, r.Close)
		return r, nil
	case "mysql":
		r, err := workerid.OpenMySQLRegistry(ctx, workerid.MySQLRegistryConfig{
			DSN:         cfg.MySQLDSN,
			Advertise:   advertise,
			MaxWorkerID: layout.MaxWorkerID(),
			CreateTable: cfg.MySQLCreateTable,
			Logger:      logger.With("component", "mysql-registry"),
		})
		if err != nil {
			return nil, fmt.Errorf("open mysql worker registry: %w", err)
		}
		m.closers = append(m.closers, r.Close)
		return r, nil
	}
	return nil, fmt.Errorf("--worker-registry %q: want kv, zk, mysql or static", cfg.WorkerRegistry)
}

// cacheFile is where this node keeps its worker ID and highest timestamp on local
// disk, for a start while the registry or KV is unreachable.
func (m *Main) cacheFile() *workerid.CacheFile {
	return &workerid.CacheFile{Path: filepath.Join(m.Config.DataDir, m.Config.Prefix+"-workerid-"+m.Config.NodeID+".json")}
}

// waitReady is for tests: it waits until m serves or d passes.
func (m *Main) waitReady(d time.Duration) error {
	select {
	case <-m.ready:
		return nil
	case <-time.After(d):
		return fmt.Errorf("dispenser not ready within %v", d)
	}
}
