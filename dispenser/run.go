package dispenser

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/oklog/run"
)

// Run runs every part as one oklog/run group until ctx ends, a signal of WithSignals
// arrives, Close is called, or a part fails; it returns nil on a clean stop and the
// failing part's error otherwise. The parts stop in this order, each waiting for its
// part to finish: stop serving NATS (answering what was delivered), then HTTP (which
// serves until NATS has drained, and then answers what it took), then the monotonic
// tags (whose leaders served those requests; their leases are given back), stop
// loading segments and filling pools, write the last heartbeat record and give the
// worker ID back. Close undoes the rest. Run may be called once.
func (d *Dispenser) Run(ctx context.Context) error {
	ctx, err := d.startRun(ctx)
	if err != nil {
		return err
	}
	defer d.endRun()

	var g run.Group
	if len(d.opts.signals) > 0 {
		g.Add(run.SignalHandler(ctx, d.opts.signals...))
	}
	{
		stop := make(chan struct{})
		g.Add(func() error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-stop:
				return nil
			}
		}, func(error) { close(stop) })
	}
	{
		stopped := make(chan struct{})
		g.Add(func() error {
			<-stopped
			return nil
		}, func(error) {
			_ = d.svc.Stop() // its error is Close's to report: Stop returns the same every call
			close(stopped)
		})
	}
	if d.http != nil {
		// Interrupted after the service, whose interrupt returns once NATS has drained.
		addLoop(&g, "http", d.http.Run)
	}
	// After the service and HTTP: the requests they still wait on are forwarded to, or
	// served by, the Manager. It gives its leases back when it stops.
	addLoop(&g, "monotonic tags", d.mono.Run)
	addLoop(&g, "segment loader", d.segments.Run)
	// The pools fill once the tag list is in; before, every segment fill would fail.
	addLoop(&g, "batch pools", afterReady(d.segments.Ready(), d.batches.Run))
	addLoop(&g, "pool stream", afterReady(d.segments.Ready(), d.poolStream.Run))
	addLoop(&g, "heartbeat", d.heartbeat.Run)
	addLoop(&g, "recovery watch", d.recovery.Run)
	addLoop(&g, "time responder", d.timeResponder.Run)
	addLoop(&g, "announcer", d.announce)
	addLoop(&g, "insecure-listen warning", d.warnInsecure)
	err = g.Run()
	switch {
	case errors.Is(err, run.ErrSignal):
		d.log.Info("stopped", "reason", err.Error())
		return nil
	case errors.Is(err, context.Canceled), err == nil:
		d.log.Info("stopped")
		return nil
	}
	return err
}

// startRun marks Run as running and returns the context Close cancels. (The worker
// identity, one of the group's actors, takes the worker ID over: its clean stop gives it
// back.)
func (d *Dispenser) startRun(parent context.Context) (context.Context, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return nil, ErrClosed
	case d.stopRun != nil:
		return nil, errors.New("dispenser: Run called twice")
	}
	ctx, cancel := context.WithCancel(parent)
	d.stopRun = cancel
	return ctx, nil
}

func (d *Dispenser) endRun() {
	d.mu.Lock()
	d.stopRun()
	d.mu.Unlock()
	close(d.runDone)
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

// announce waits until the segment tags and the monotonic marks are loaded (before,
// no tag's mark is known: a segment request waits for them up to WaitMax over NATS and
// is a 503 at once over HTTP), then says how to ask for an
// ID and closes Ready. It stays running until stopped, so that it is an actor like the
// others.
func (d *Dispenser) announce(ctx context.Context) error {
	for _, ready := range []<-chan struct{}{d.segments.Ready(), d.mono.Ready()} {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil
		}
	}
	cfg := d.cfg
	d.log.Info("serving", "nats", d.clientURL, "http", d.statusURL(), "prefix", cfg.Prefix, "segment_store", cfg.SegmentStore, "worker_registry", cfg.WorkerRegistry)
	if d.opts.banner != nil {
		writeBanner(d.opts.banner, d.clientURL, cfg.Prefix, d.statusURL())
	}
	close(d.ready)
	<-ctx.Done()
	return nil
}

// writeBanner tells a newcomer how to ask for IDs with the nats CLI and, when HTTP
// serves, where the status page is. Scripts read these lines: keep them byte for byte.
func writeBanner(w io.Writer, url, prefix, statusURL string) {
	server := ""
	if url != "nats://127.0.0.1:4222" {
		server = " --server " + url
	}
	fmt.Fprintf(w, `leafbus is serving on %s. Ask for IDs with the nats CLI:
  nats%s req %s.segment.%s ""
  nats%s req %s.snowflake.any ""
  nats%s req %s.segment.%s 5      (five IDs)
`, url, server, prefix, SampleTagName, server, prefix, server, prefix, SampleTagName)
	if statusURL != "" {
		fmt.Fprintf(w, "status page: %s\n", statusURL)
	}
}
