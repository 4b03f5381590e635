package dispenser

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/buildinfo"
	"github.com/leafbus/leafbus/internal/datadir"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/monotonic"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/workerid"
)

// ErrClosed is returned by Run when Close was called first.
var ErrClosed = errors.New("dispenser closed")

// releaseTimeout bounds giving the worker ID back when a start fails.
const releaseTimeout = 5 * time.Second

// Dispenser is one running dispenser: every part New built, run by Run as one oklog/run
// group, and undone by Close.
type Dispenser struct {
	cfg   Config
	opts  options
	log   *slog.Logger
	clock snowflake.Clock
	ready chan struct{}
	build buildinfo.Info // this binary's version ($SRV.INFO, banner, status page, metrics)

	// Built by New, in this order (see steps).
	dirLock       *datadir.Lock // the data dir's, from the first step until the last undo
	storeOnDisk   bool          // the data dir held an embedded segment store before this start
	freshDataDir  bool          // the data dir was never used for segments (datadir.go)
	marks         segment.Marks // this node's high-water marks, in the data dir (marks.go)
	embedded      *bus.Embedded
	clientURL     string
	nc            *nats.Conn // store, registry, clock records, heartbeats
	js            jetstream.JetStream
	store         segment.Store
	segments      *segment.Generator
	mono          *monotonic.Manager // monotonic tags and tag ranges (monotonic.go)
	idKey         []byte             // the ID key of opaque tags (idkey.go); nil: none
	shaper        *core.Shaper       // gives segment replies their tag's range (monotonic.go)
	registry      workerid.Registry
	forever       *workerid.Forever
	floor         int64
	snowflakes    *snowflake.Generator
	heartbeat     *workerid.Keeper // this node's worker identity: its heartbeat, and the next worker ID's after a loss (worker.go)
	recovery      *recoveryWatch   // time from a fault's end to full service (recovery.go)
	timeResponder *workerid.TimeResponder
	batches       *pools.Batches
	poolStream    *pools.Stream
	core          *core.Core // what every request means, for both faces
	svc           *bus.Service
	metrics       *metrics.Metrics // told of every answer, read by /metrics (http.go)
	http          *httpapi.Server  // nil: HTTP off, or the default address was taken
	monitor       *httpapi.Server  // the operator pages' own listener (--monitor-listen); nil: none
	denied        deniedWatch      // permissions violations on nc while a step of New runs (startwait.go)

	// The deployment record (deployment.go): where it is, what this dispenser is, and
	// the record as the start-up check left it.
	records  *deployment.Records
	own      deployment.Own
	deployed deployment.Entry
	watch    *deployment.Watch // keeps the record in step while Run runs (deployment.go)

	rangeMu       sync.Mutex
	refusedRanges map[string]string // tag: why the record's range for it is refused (checkRanges)
	heldRanges    map[string]string // tag: why the last read would have refused it (checkRanges)

	// closers undo what New built, in reverse order; Close is the only place they run.
	closers []closer

	mu      sync.Mutex
	closed  bool
	stopRun context.CancelFunc // set while Run runs
	runDone chan struct{}      // closed when Run returns

	closeOnce sync.Once
	closeErr  error
}

// closer is one thing Close undoes.
type closer struct {
	name string
	undo func() error
}

// New validates cfg and builds every part of a dispenser: NATS (embedded, or connections
// to cfg.NATS), the segment store and generator, the worker-ID registry and lease, the
// clock guard, the snowflake generator and its first heartbeat, the time responder, the
// pools and the service. The service answers requests from the moment New returns;
// background work (segment loading, heartbeats, pool filling) starts with Run.
//
// ctx bounds the start (waiting for ZooKeeper, the clock guard's wait past its floor):
// New gives up when it ends, and keeps no reference to it. When a step fails, New undoes
// every earlier one before it returns, through Close: in particular a worker ID already
// acquired is given back at once, never left to expire.
func New(ctx context.Context, cfg Config, opts ...Option) (*Dispenser, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.resolveLayout()
	d := &Dispenser{
		cfg:     cfg,
		build:   buildinfo.Read(),
		opts:    options{logger: slog.New(slog.DiscardHandler), clock: snowflake.SystemClock()},
		ready:   make(chan struct{}),
		runDone: make(chan struct{}),
	}
	for _, opt := range opts {
		if err := opt(&d.opts); err != nil {
			return nil, err
		}
	}
	d.log = d.opts.logger.With("node", cfg.NodeID)
	d.clock = d.opts.clock
	d.recovery = newRecoveryWatch(d)
	deadline := time.Now().Add(cfg.StartTimeout) // waits for dependencies end here (startwait.go)
	for _, s := range d.steps() {
		if d.opts.onlySteps != nil && !d.opts.onlySteps[s.name] {
			continue // an admin command's part of a start (admin.go)
		}
		err := d.runStep(ctx, s, deadline)
		if err == nil && d.opts.afterStep != nil {
			err = d.opts.afterStep(s.name, d)
		}
		if err != nil {
			if cerr := d.Close(); cerr != nil {
				d.log.Warn("undo a failed start", "step", s.name, "err", cerr)
			}
			return nil, err
		}
	}
	return d, nil
}

// Ready is closed once the dispenser serves: Run has started, the segment tags are in
// and the monotonic marks loaded.
func (d *Dispenser) Ready() <-chan struct{} { return d.ready }

// ClientURL is the NATS URL the dispenser serves on: the embedded server's, or cfg.NATS.
func (d *Dispenser) ClientURL() string { return d.clientURL }

// onClose registers undo to run at Close, before everything registered earlier.
func (d *Dispenser) onClose(name string, undo func() error) {
	d.closers = append(d.closers, closer{name, undo})
}

// Close stops Run if it runs and waits for it, then undoes everything New built, last
// built first: the service, the worker ID (given back, unless the heartbeat already did
// at its clean stop), the registry and store, the NATS connections and the embedded
// server. It is safe to call more than once and from any goroutine; every call returns
// the first call's result, the errors of the undo steps that failed.
func (d *Dispenser) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		stop := d.stopRun
		d.mu.Unlock()
		if stop != nil {
			stop()
			<-d.runDone
		}
		var errs []error
		for i := len(d.closers) - 1; i >= 0; i-- {
			if err := d.closers[i].undo(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", d.closers[i].name, err))
			}
		}
		d.closers = nil
		d.closeErr = errors.Join(errs...)
	})
	return d.closeErr
}
