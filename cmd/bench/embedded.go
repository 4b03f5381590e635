package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/segment"
)

// embeddedTagStep is the stored step of the tags an embedded run creates: Leaf's sample
// tag's, so the dynamic step has to grow as it would in a fresh deployment.
const embeddedTagStep = 2000

// startEmbedded starts a whole dispenser (package dispenser, as `dispenser` runs it) with
// its own embedded NATS server on a loopback port and a throw-away data directory, inside
// this process, so that `bench --embedded` is a one-command test. It creates every tag of
// --tags. It returns the client URL to load and a stop function that returns once
// everything it started has shut down.
//
// The worker ID is static (0): the data directory, hence every issued ID, is deleted on
// stop, so no other holder or later run could repeat one. With --store-delay every
// segment store call is slowed down, to see what a slow MySQL does to latency (bar 4 of
// BENCHMARKS.md).
func startEmbedded(ctx context.Context, cfg Config, logger *slog.Logger) (url string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "leafbus-bench-")
	if err != nil {
		return "", nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	dcfg := dispenser.DefaultConfig()
	dcfg.Listen = "127.0.0.1:0"
	dcfg.DataDir = dir
	dcfg.Prefix = cfg.Prefix
	dcfg.NodeID = "bench-embedded"
	dcfg.SampleTag = false
	dcfg.WorkerRegistry = "static"
	dcfg.WorkerID = 0
	dcfg.HTTP = "" // bench loads NATS; a dispenser on this host may hold the default port
	opts := []dispenser.Option{dispenser.WithLogger(logger)}
	for _, tag := range cfg.Tags {
		opts = append(opts, dispenser.WithTags(segment.Tag{Name: tag, MaxID: 1, Step: embeddedTagStep, Description: "bench"}))
	}
	if cfg.StoreDelay > 0 {
		opts = append(opts, dispenser.WrapSegmentStore(func(s segment.Store) segment.Store {
			return slowStore{Store: s, delay: cfg.StoreDelay}
		}))
	}
	d, err := dispenser.New(ctx, dcfg, opts...)
	if err != nil {
		return "", nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = d.Run(runCtx)
	}()
	stop = func() {
		cancel()
		<-done
		if err := d.Close(); err != nil {
			logger.Warn("embedded dispenser: close", "err", err)
		}
		os.RemoveAll(dir)
	}
	select {
	case <-d.Ready():
		return d.ClientURL(), stop, nil
	case <-done:
		stop()
		return "", nil, fmt.Errorf("embedded dispenser stopped before it was ready: %w", runErr)
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	}
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
