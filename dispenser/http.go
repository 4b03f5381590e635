package dispenser

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/fdlimit"
	"github.com/leafbus/leafbus/metrics"
)

// The HTTP face (PROTOCOL.md "HTTP"): the metrics are built before the service, which
// reports every NATS answer to them, and the HTTP server after it, on the same
// generators. Run serves HTTP until the NATS service has drained.

// newMetrics builds the Prometheus registry over this dispenser's parts: the segment
// buffers, the snowflake worker and its lease, the pools and the embedded NATS server.
func (d *Dispenser) newMetrics(context.Context) (err error) {
	d.metrics, err = metrics.New(metrics.Config{
		Build:   d.build,
		MaxTags: d.cfg.MetricsMaxTags,
		Sources: d.sources(),
	})
	return err
}

// sources are the snapshots /metrics and the status page read.
func (d *Dispenser) sources() metrics.Sources {
	cfg := d.cfg
	src := metrics.Sources{
		SegmentTags: core.SegmentState(d.segments),
		Snowflake:   core.SnowflakeState(d.snowflakes, d.heartbeat, cfg.WorkerRegistry, cfg.leaseTTL()),
		Pools:       core.PoolState(d.batches, d.poolStream),
	}
	if d.embedded != nil {
		src.NATS = func() metrics.NATSServer { return embeddedFigures(d.embedded) }
	}
	if d.recovery != nil {
		src.Recovery = d.recovery.Metrics
	}
	src.Monotonic = monotonicState(d.mono) // built before the metrics (build.go)
	src.Deployment = d.deploymentState
	return src
}

// startHTTP binds --http by PROTOCOL.md's rule: the default address taken by another
// process (several dispensers on one host) is a warning, and this dispenser serves
// without HTTP; any other failure is a start-up error. Run serves on the bound address.
func (d *Dispenser) startHTTP(context.Context) error {
	cfg := d.cfg
	if cfg.HTTP == "" && cfg.MonitorListen == "" {
		return nil
	}
	maxConns, fileLimit, reserve := httpConnCap(cfg.HTTPMaxConns, fdlimit.Soft)
	switch {
	case fileLimit == 0:
		d.log.Info("HTTP connections capped; the open file limit is unknown here", "max_conns", maxConns)
	case maxConns < cfg.HTTPMaxConns:
		d.log.Warn(fmt.Sprintf("--http-max-conns %d lowered to %d: the open file limit is %d, and %d descriptors are kept for NATS, the stores and this node's files; raise the hard limit (ulimit -Hn, systemd's LimitNOFILE) for more",
			cfg.HTTPMaxConns, maxConns, fileLimit, reserve), "max_conns", maxConns, "file_limit", fileLimit)
	default:
		d.log.Info("HTTP connections capped", "max_conns", maxConns, "file_limit", fileLimit, "reserved", reserve)
	}
	hc := httpapi.Config{
		Version:   d.build.String(),
		Core:      d.core,
		MaxConns:  maxConns,
		Metrics:   d.metrics,
		Readiness: d.withDeployment(d.withMarks(core.HealthOf(d.segments, d.snowflakes, d.heartbeat))),
		Status: httpapi.Status{
			// A --nats URL may carry a user and password: the page shows none.
			NodeID: cfg.NodeID, Prefix: cfg.Prefix, NATS: client.RedactURLs(d.clientURL), SegmentStore: cfg.SegmentStore,
			Sources:  d.sources(),
			Cluster:  httpapi.Discover(d.nc, cfg.Prefix, cfg.NodeID),
			TagRange: d.describeRange,
			Rows:     d.store, // the store's rows (leaf_alloc with MySQL), as Leaf's /db page shows them
			Opaque:   d.opaqueTag,
		},
		Logger: d.log.With("component", "http"),
	}
	if cfg.MonitorListen != "" {
		// The operator pages on a listener of their own, first: the ID listener's
		// failure to bind the default address leaves it serving alone.
		mc := hc
		mc.Face, mc.Logger = httpapi.FaceMonitor, d.log.With("component", "monitor-http")
		mon, err := httpapi.New(cfg.MonitorListen, mc)
		if err != nil {
			return err
		}
		if err := mon.Listen(true); err != nil {
			return fmt.Errorf("--monitor-listen: %w", err)
		}
		d.monitor = mon
		d.onClose("monitor http server", mon.Close)
		hc.Face = httpapi.FaceIDs
	}
	if cfg.HTTP == "" {
		return nil
	}
	srv, err := httpapi.New(cfg.HTTP, hc)
	if err != nil {
		return err
	}
	switch err := srv.Listen(cfg.HTTPExplicit); {
	case errors.Is(err, httpapi.ErrDefaultTaken):
		d.log.Warn("serving without HTTP", "err", err)
		return nil
	case err != nil:
		return err
	}
	d.http = srv
	d.onClose("http server", srv.Close)
	return nil
}

// HTTPAddr is the address the HTTP face listens on (the port resolved when 0 was asked
// for), or nil when it is off or the default address was taken.
func (d *Dispenser) HTTPAddr() net.Addr {
	if d.http == nil {
		return nil
	}
	return d.http.Addr()
}

// MonitorAddr is the address of the operator pages' own listener (--monitor-listen),
// or nil without one.
func (d *Dispenser) MonitorAddr() net.Addr {
	if d.monitor == nil {
		return nil
	}
	return d.monitor.Addr()
}

// opaqueTag reports whether tag is opaque (or would be, where this node refuses its
// range): its counters are shown on the monitor listener only.
func (d *Dispenser) opaqueTag(tag string) bool {
	if d.shaper == nil {
		return false
	}
	r, _, _ := d.shaper.Range(tag)
	return r.Opaque
}

// statusURL is the status page's URL for the banner (on --monitor-listen when given),
// "" without HTTP. An address on every interface is shown as loopback, where it can
// certainly be opened.
func (d *Dispenser) statusURL() string {
	page := d.HTTPAddr()
	if d.monitor != nil {
		page = d.MonitorAddr()
	}
	addr, ok := page.(*net.TCPAddr)
	if !ok {
		return ""
	}
	ip := addr.IP
	switch {
	case ip.IsUnspecified() && ip.To4() != nil:
		ip = net.IPv4(127, 0, 0, 1)
	case ip.IsUnspecified():
		ip = net.IPv6loopback
	}
	return "http://" + net.JoinHostPort(ip.String(), fmt.Sprint(addr.Port)) + "/"
}

// embeddedFigures is the embedded server's figures for /metrics: its client connections
// and JetStream storage. A server whose JetStream is off or not up yet reports no
// storage rather than failing the scrape.
func embeddedFigures(e *bus.Embedded) metrics.NATSServer {
	v, err := e.Varz()
	if err != nil {
		return metrics.NATSServer{}
	}
	n := metrics.NATSServer{Connections: v.Connections}
	if s := v.JetStream.Stats; s != nil {
		n.JetStreamMemory, n.JetStreamStore = s.Memory, s.Store
	}
	if c := v.JetStream.Config; c != nil {
		n.JetStreamMaxMemory, n.JetStreamMaxStore = c.MaxMemory, c.MaxStore
	}
	return n
}

// leaseTTL is how long the worker ID's lease lasts unrenewed, for the metrics: the KV
// registry's and ZooKeeper's with --zk-recycle; 0 for a worker ID held for good.
func (c Config) leaseTTL() time.Duration {
	if c.WorkerRegistry == "kv" || (c.WorkerRegistry == "zk" && c.ZKRecycle) {
		return c.LeaseTTL
	}
	return 0
}

// fdReserveMax is the most descriptors the HTTP connection cap leaves to the rest of the
// process: the embedded NATS server's clients and JetStream files, the MySQL pool,
// ZooKeeper, the cache file and the logs. A smaller file limit keeps half.
const fdReserveMax = 1024

// httpConnCap is the HTTP connection cap in effect: --http-max-conns, lowered so that
// fdReserveMax descriptors (half of a smaller limit) stay for the rest of the process,
// whatever the HTTP clients do. softLimit reads the open file limit (fdlimit.Soft); when
// it cannot, the flag stands and fileLimit is 0.
func httpConnCap(flagMax int, softLimit func() (uint64, error)) (maxConns int, fileLimit, reserve uint64) {
	limit, err := softLimit()
	if err != nil || limit == 0 {
		return flagMax, 0, 0
	}
	reserve = min(fdReserveMax, limit/2)
	room := max(limit-reserve, 1)
	if room < uint64(flagMax) {
		return int(room), limit, reserve
	}
	return flagMax, limit, reserve
}

// checkHTTP checks --http, --http-max-conns and --metrics-max-tags.
func (c Config) checkHTTP() []error {
	var errs []error
	if c.HTTPMaxConns < 1 {
		errs = append(errs, fmt.Errorf("--http-max-conns %d: want 1 or more", c.HTTPMaxConns))
	}
	if c.HTTP != "" {
		if _, _, err := bus.SplitHostPort(c.HTTP); err != nil {
			errs = append(errs, fmt.Errorf("--http %q: %w (empty turns HTTP off)", c.HTTP, err))
		}
	}
	if c.MonitorListen != "" {
		if _, _, err := bus.SplitHostPort(c.MonitorListen); err != nil {
			errs = append(errs, fmt.Errorf("--monitor-listen %q: %w (empty keeps the operator pages on --http)", c.MonitorListen, err))
		} else if c.MonitorListen == c.HTTP && !strings.HasSuffix(c.HTTP, ":0") {
			errs = append(errs, fmt.Errorf("--monitor-listen %q is --http's address: give the operator pages another (or leave --monitor-listen empty)", c.MonitorListen))
		}
	}
	if c.MetricsMaxTags < 0 {
		errs = append(errs, fmt.Errorf("--metrics-max-tags %d: want 0 or more", c.MetricsMaxTags))
	}
	return errs
}
