package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/service"
	"github.com/leafbus/leafbus/snowflake"
)

// embeddedTagStep is the stored step of the tags an embedded run creates: Leaf's sample
// tag's, so the dynamic step has to grow as it would in a fresh deployment.
const embeddedTagStep = 2000

// startEmbedded starts a dispenser's serving path, with its own embedded NATS server on a
// loopback port and a throw-away data directory, inside this process, so that
// `bench --embedded` is a one-command test. It creates every tag of --tags. It returns
// the client URL to load and a stop function that returns once everything it started
// has shut down.
//
// What runs is what answers requests in a real dispenser: the embedded server, the
// JetStream KV segment store, segment.Generator, snowflake.Generator and service.Service.
// The worker-ID registry, clock guard and heartbeat are left out: they are off the
// request path, and the data directory (hence every issued ID) is deleted on stop, so
// there is nothing a clock step could repeat. With --store-delay every store call is
// slowed down, to see what a slow MySQL does to latency (bar 4 of BENCHMARKS.md).
func startEmbedded(ctx context.Context, cfg Config, logger *slog.Logger) (url string, stop func(), err error) {
	var undo []func()
	stopAll := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stopAll()
		}
	}()

	dir, err := os.MkdirTemp("", "leafbus-bench-")
	if err != nil {
		return "", nil, err
	}
	undo = append(undo, func() { os.RemoveAll(dir) })
	srv, err := dispenser.StartEmbedded(dispenser.EmbeddedConfig{Listen: "127.0.0.1:0", DataDir: dir, Name: "bench-embedded", Logger: logger})
	if err != nil {
		return "", nil, err
	}
	undo = append(undo, srv.Shutdown)
	nc, err := srv.Connect(nats.Name("bench embedded store"))
	if err != nil {
		return "", nil, err
	}
	undo = append(undo, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return "", nil, fmt.Errorf("JetStream: %w", err)
	}
	kv, err := segment.OpenKVStore(ctx, js, cfg.Prefix+"_segments", 1)
	if err != nil {
		return "", nil, fmt.Errorf("open segment store: %w", err)
	}
	for _, tag := range cfg.Tags {
		_, err := kv.AddTag(ctx, segment.Tag{Name: tag, MaxID: 1, Step: embeddedTagStep, Description: "bench"})
		if err != nil && !errors.Is(err, segment.ErrTagExists) {
			return "", nil, fmt.Errorf("create tag %q: %w", tag, err)
		}
	}
	var store segment.Store = kv
	if cfg.StoreDelay > 0 {
		store = slowStore{Store: kv, delay: cfg.StoreDelay}
	}

	segCfg := segment.DefaultConfig()
	segCfg.Store, segCfg.Logger = store, logger
	segments, err := segment.New(segCfg)
	if err != nil {
		return "", nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := segments.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Warn("segment generator stopped", "err", err)
		}
	}()
	undo = append(undo, func() { cancel(); <-done })
	select {
	case <-segments.Ready():
	case <-ctx.Done():
		return "", nil, ctx.Err()
	}

	layout := snowflake.DefaultLayout()
	snowflakes, err := snowflake.New(snowflake.Config{Layout: layout, WorkerID: 0, Clock: snowflake.SystemClock()})
	if err != nil {
		return "", nil, err
	}
	svcConn, err := srv.Connect(nats.Name("bench embedded service"))
	if err != nil {
		return "", nil, err
	}
	undo = append(undo, svcConn.Close)
	svcCfg := service.DefaultConfig()
	svcCfg.Prefix = cfg.Prefix
	svcCfg.Layout = layout
	svcCfg.Segments = segments
	svcCfg.Snowflakes = snowflakes
	svcCfg.Tags = kv
	svcCfg.Logger = logger
	svc, err := service.New(svcConn, svcCfg)
	if err != nil {
		return "", nil, err
	}
	undo = append(undo, func() {
		if err := svc.Stop(); err != nil {
			logger.Warn("service stop", "err", err)
		}
	})
	return srv.ClientURL(), stopAll, nil
}

// slowStore delays every segment allocation, as a slow or distant database would.
type slowStore struct {
	segment.Store
	delay time.Duration
}

func (s slowStore) Take(ctx context.Context, tag string, step int64) (segment.Tag, error) {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return segment.Tag{}, ctx.Err()
	}
	return s.Store.Take(ctx, tag, step)
}
