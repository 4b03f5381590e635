package dispenser

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/monotonic"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// Config is everything an operator sets. cmd/dispenser fills it from flags and
// LEAFBUS_<NAME> environment variables (PROTOCOL.md "Running a dispenser": those names are
// fixed), which is why the messages of Validate name the flags.
type Config struct {
	Listen  string // embedded NATS client address
	DataDir string // embedded JetStream store, and the worker-ID cache file
	Monitor string // embedded NATS HTTP monitoring address; "" = off
	NATS    string // existing NATS servers; "" = embed one
	Conn    client.ConnConfig

	// NATSConfig is a nats-server configuration file for the embedded server (--nats-config):
	// accounts, users, permissions, TLS. InsecureListen lets the embedded server listen on a
	// non-loopback address without authentication. ServiceAuth, when set, authenticates the
	// service connection instead of Conn's credentials (auth.go).
	NATSConfig     string
	InsecureListen bool
	ServiceAuth    Credentials

	Prefix     string
	NodeID     string
	Advertise  string // ip:port this node registers under (ZooKeeper / MySQL registries)
	KVReplicas int

	SegmentStore     string // kv | mysql
	MySQLDSN         string
	MySQLCreateTable bool
	SampleTag        bool // create leaf-segment-test when the store has no such tag, in a data dir never used for segments only (datadir.go)

	// AllowStoreBehind starts a dispenser whose segment store is behind its high-water
	// marks (tags lost or rewound) instead of refusing: those tags answer 503 until an
	// operator raises their max_id through the admin API (marks.go).
	AllowStoreBehind bool

	WorkerRegistry string // kv | zk | mysql | static
	WorkerID       int64  // with static; -1 = not given
	ZK             string
	ZKName         string
	ZKRecycle      bool
	LeaseTTL       time.Duration

	// MonotonicLeaseTTL is the lease of the leader of a monotonic tag
	// (--monotonic-lease-ttl, 6 s), renewed every sixth of it: after a leader dies its
	// tags answer 503 for about this long. Every dispenser of a deployment must use the
	// same (the <prefix>_leaders bucket keeps records for twice it).
	MonotonicLeaseTTL time.Duration

	// WorkerIDMin and WorkerIDMax bound the worker IDs this deployment's registry hands
	// out (--worker-id-min, --worker-id-max; 0 and the layout's highest, 1023): each
	// datacenter gets a range of its own (worker_range.go).
	WorkerIDMin int64
	WorkerIDMax int64

	MaxBatch int
	Pools    pools.Specs
	Epoch    int64 // snowflake epoch, Unix ms
	// SnowflakeLayout names the snowflake bit layout (--snowflake-layout):
	// snowflake.LayoutLeaf (Leaf's 41+10+12, the default) or snowflake.LayoutJS53 (every
	// ID at or below 2^53-1). With a layout of fewer worker IDs than Leaf's, a
	// WorkerIDMax left at Leaf's 1023 means the layout's highest.
	SnowflakeLayout string
	DenseSequence   bool

	ClockWaitMax time.Duration
	PeerSkewMax  time.Duration
	ClockJumpMax time.Duration
	BorrowMax    time.Duration

	// StartTimeout bounds how long New waits for its dependencies (--nats servers,
	// JetStream, the segment store, the worker-ID registry) to become ready, retrying
	// with back-off and logging each wait, before it refuses (--start-timeout, 30 s; 0:
	// refuse at the first failure). A refusal for safety (a clock behind its records,
	// another process under this identity, a store behind its marks) is never waited
	// out (startwait.go).
	StartTimeout time.Duration

	// HTTP is the HTTP listener (--http, PROTOCOL.md "HTTP"): Leaf's API, the status
	// page, /metrics and the probes; "" turns it off. HTTPExplicit says the operator set
	// it (flag or LEAFBUS_HTTP): an explicit address that cannot be bound is a start-up
	// error, while the default taken by another process (several dispensers on one host)
	// is a warning, and the dispenser serves without HTTP.
	HTTP         string
	HTTPExplicit bool
	// MonitorListen is the operator pages' own listener (--monitor-listen): the status
	// page, /cache, /db and /metrics move there, every tag's counters shown, and --http
	// keeps the ID API (and the probes, which both serve). "": one listener, --http,
	// where opaque tags' counters are left out.
	MonitorListen string
	// IDKeyFile names the file holding the ID key of opaque tags (--id-key-file); IDKey
	// is the key itself, as such a file holds it (LEAFBUS_ID_KEY, with no flag: a key
	// never stands on a command line). At most one of them; with neither, opaque tags
	// are refused (idkey.go). The key is never logged or written anywhere.
	IDKeyFile string
	IDKey     string

	// HTTPMaxConns caps the HTTP connections open at once (--http-max-conns); the cap in
	// effect is lower when the open file limit leaves less room (httpConnCap).
	HTTPMaxConns int
	// MetricsMaxTags bounds the tag label of the per-tag segment metrics
	// (--metrics-max-tags): the busiest tags by name, the rest summed as tag="_other".
	MetricsMaxTags int
}

// SampleTagName is Leaf's sample row, ready in the embedded default (Config.SampleTag) so
// that a newcomer's first request works; SampleTagStep is its step.
const (
	SampleTagName = "leaf-segment-test"
	SampleTagStep = 2000
)

// DefaultConfig is the one-binary default: embedded NATS on 127.0.0.1:4222, segments and
// worker-ID leases in JetStream KV under ./leafbus-data, the node named after the host.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:4222",
		DataDir:         "./leafbus-data",
		Prefix:          wire.DefaultPrefix,
		NodeID:          defaultNodeID(),
		KVReplicas:      1,
		SegmentStore:    "kv",
		SampleTag:       true,
		WorkerRegistry:  "kv",
		WorkerID:        -1,
		ZKName:          "leafbus",
		LeaseTTL:        30 * time.Second,
		WorkerIDMax:     snowflake.DefaultLayout().MaxWorkerID(),
		MaxBatch:        wire.DefaultMaxBatch,
		Epoch:           snowflake.DefaultLayout().Epoch,
		SnowflakeLayout: snowflake.LayoutLeaf,
		PeerSkewMax:     5 * time.Second,
		ClockJumpMax:    time.Hour,
		BorrowMax:       time.Second,
		HTTP:            httpapi.DefaultAddr,
		HTTPMaxConns:    httpapi.DefaultMaxConns,
		MetricsMaxTags:  metrics.DefaultMaxTags,
		StartTimeout:    30 * time.Second,

		MonotonicLeaseTTL: monotonic.DefaultConfig().LeaseTTL,
	}
}

// Validate checks every setting and every cross-field rule before anything starts,
// naming the flag, its value and what is allowed. It reports every mistake, not only the
// first.
func (c Config) Validate() error {
	c = c.resolveLayout()
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := wire.CheckPrefix(c.Prefix); err != nil {
		errs = append(errs, err)
	}
	if err := workerid.CheckNodeID(c.NodeID); err != nil {
		add("--node-id: %w", err)
	}
	errs = append(errs, c.checkNATS()...)
	errs = append(errs, c.checkAuth()...)
	errs = append(errs, c.checkModes()...)
	if c.DataDir == "" {
		add("--data-dir is empty: the worker-ID cache file lives there")
	}
	if c.KVReplicas < 1 || c.KVReplicas > 5 {
		add("--kv-replicas %d: want 1 to 5 (JetStream's limit)", c.KVReplicas)
	}
	switch c.SegmentStore {
	case "kv":
	case "mysql":
		if c.MySQLDSN == "" {
			add("--segment-store mysql needs --mysql-dsn")
		}
	default:
		add("--segment-store %q: want kv or mysql", c.SegmentStore)
	}
	if _, err := snowflake.NamedLayout(c.SnowflakeLayout); err != nil {
		add("--snowflake-layout: %w", err)
	} else if err := c.Layout().Validate(); err != nil {
		add("--epoch %d: %w", c.Epoch, err)
	}
	errs = append(errs, c.checkRegistry()...)
	errs = append(errs, c.checkWorkerRange()...)
	if err := workerid.CheckLeaseTTL(c.LeaseTTL, wire.HeartbeatInterval); err != nil {
		add("--lease-ttl %v: %v", c.LeaseTTL, err)
	}
	if err := wire.CheckMaxBatch(c.MaxBatch); err != nil {
		errs = append(errs, err)
	}
	for _, p := range c.Pools {
		if p.Size > c.MaxBatch {
			add("--pool %s: batch size %d is over --max-batch %d", p, p.Size, c.MaxBatch)
		}
	}
	errs = append(errs, c.checkClock()...)
	errs = append(errs, c.checkHTTP()...)
	errs = append(errs, c.checkMonotonic()...)
	errs = append(errs, c.checkIDKey()...)
	return errors.Join(errs...)
}

// checkNATS checks the embedded server's addresses, or the --nats connection settings.
func (c Config) checkNATS() []error {
	if c.NATS == "" {
		if err := (bus.EmbeddedConfig{Listen: c.Listen, DataDir: c.DataDir, Monitor: c.Monitor}).Validate(); err != nil {
			return []error{err}
		}
		return nil
	}
	if err := c.connConfig("").Validate(); err != nil {
		return []error{fmt.Errorf("--nats: %w", err)}
	}
	return nil
}

// checkRegistry checks the worker-ID registry and the flags that go with it.
func (c Config) checkRegistry() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	maxID := c.Layout().MaxWorkerID()
	switch c.WorkerRegistry {
	case "static":
		if c.WorkerID < 0 || c.WorkerID > maxID {
			add("--worker-registry static needs --worker-id from 0 to %d, got %d", maxID, c.WorkerID)
		}
	case "kv":
	case "zk":
		if c.ZK == "" {
			add("--worker-registry zk needs --zk host:port[,host:port]")
		}
		if c.NATS != "" && c.Advertise == "" {
			add("--worker-registry zk with --nats needs --advertise ip:port (the identity this node keeps its worker ID under)")
		}
		if c.listensOnAnyPort() && c.Advertise == "" {
			add("--worker-registry zk with --listen %s needs --advertise ip:port: an identity of its own that survives a restart (docs/errors.md#advertise)", c.Listen)
		}
	case "mysql":
		if c.MySQLDSN == "" {
			add("--worker-registry mysql needs --mysql-dsn")
		}
		if c.NATS != "" && c.Advertise == "" {
			add("--worker-registry mysql with --nats needs --advertise ip:port (the identity this node keeps its worker ID under)")
		}
		if c.listensOnAnyPort() && c.Advertise == "" {
			add("--worker-registry mysql with --listen %s needs --advertise ip:port: an identity of its own that survives a restart (docs/errors.md#advertise)", c.Listen)
		}
	default:
		add("--worker-registry %q: want kv, zk, mysql or static", c.WorkerRegistry)
	}
	if c.WorkerID >= 0 && c.WorkerRegistry != "static" {
		add("--worker-id %d is only used with --worker-registry static (got %s)", c.WorkerID, c.WorkerRegistry)
	}
	if c.ZKRecycle && c.WorkerRegistry != "zk" {
		add("--zk-recycle is only used with --worker-registry zk (got %s)", c.WorkerRegistry)
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			add("--advertise %q: want ip:port: %w", c.Advertise, err)
		}
	}
	return errs
}

// checkClock checks the durations of the clock guard, heartbeat and generator.
func (c Config) checkClock() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--clock-wait-max", c.ClockWaitMax}, {"--peer-skew-max", c.PeerSkewMax}, {"--clock-jump-max", c.ClockJumpMax}, {"--borrow-max", c.BorrowMax}, {"--start-timeout", c.StartTimeout}} {
		if d.v < 0 {
			add("%s %v: want >= 0", d.name, d.v)
		}
	}
	if c.PeerSkewMax == 0 {
		add("--peer-skew-max 0: want > 0 (clocks are never exactly equal)")
	}
	if c.ClockJumpMax < time.Minute {
		add("--clock-jump-max %v: want at least 1m (ordinary NTP corrections are far smaller)", c.ClockJumpMax)
	}
	if c.BorrowMax > time.Minute {
		add("--borrow-max %v: want at most 1m (a restarted node waits this long past its record)", c.BorrowMax)
	}
	return errs
}

// Layout is the snowflake bit layout named by SnowflakeLayout, with the configured epoch.
func (c Config) Layout() snowflake.Layout {
	l, err := snowflake.NamedLayout(c.SnowflakeLayout)
	if err != nil {
		l = snowflake.DefaultLayout() // Validate has refused the name
	}
	l.Epoch = c.Epoch
	return l
}

// resolveLayout is c with a WorkerIDMax left at Leaf's highest worker ID narrowed to the
// layout's (31 with js53): the default means "every worker ID of the layout", and no
// larger value fits a narrower one.
func (c Config) resolveLayout() Config {
	if leaf := snowflake.DefaultLayout().MaxWorkerID(); c.WorkerIDMax == leaf {
		c.WorkerIDMax = min(leaf, c.Layout().MaxWorkerID())
	}
	return c
}

// connConfig is how to reach --nats, naming the connection.
func (c Config) connConfig(name string) client.ConnConfig {
	conn := c.Conn
	conn.URLs, conn.Name = c.NATS, name
	return conn
}

// cacheFile is where this node keeps its worker ID and highest timestamp on local disk,
// for a start while the registry or KV is unreachable.
func (c Config) cacheFile() *workerid.CacheFile {
	return &workerid.CacheFile{Path: filepath.Join(c.DataDir, c.Prefix+"-workerid-"+c.NodeID+".json")}
}

// listensOnAnyPort reports whether the embedded server takes a port the kernel picks
// (--listen host:0), which is no identity to advertise.
func (c Config) listensOnAnyPort() bool {
	_, port, err := net.SplitHostPort(c.Listen)
	return c.NATS == "" && err == nil && port == "0"
}

// advertiseAddr is --advertise, or the first non-loopback IPv4 with --listen's port.
func (c Config) advertiseAddr() (string, error) {
	if c.Advertise != "" {
		return c.Advertise, nil
	}
	_, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("list interface addresses for --advertise: %w", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return net.JoinHostPort(ipn.IP.String(), port), nil
		}
	}
	return "", errors.New("no non-loopback IPv4 address to advertise: give --advertise ip:port")
}

// defaultNodeID is the host name with every character a node ID may not hold turned into
// '-', cut to 64.
func defaultNodeID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "leafbus"
	}
	b := []byte(h)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b[:min(len(b), 64)])
}
