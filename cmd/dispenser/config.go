package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// Config is everything an operator sets, by flag or by LEAFBUS_<NAME> environment
// variable (PROTOCOL.md "Running a dispenser": those names are fixed).
type Config struct {
	Listen  string // embedded NATS client address
	DataDir string // embedded JetStream store, and the worker-ID cache file
	Monitor string // embedded NATS HTTP monitoring address; "" = off
	NATS    string // existing NATS servers; "" = embed one
	Conn    client.ConnConfig

	Prefix     string
	NodeID     string
	Advertise  string // ip:port this node registers under (ZooKeeper / MySQL registries)
	KVReplicas int

	SegmentStore     string // kv | mysql
	MySQLDSN         string
	MySQLCreateTable bool
	SampleTag        bool // create leaf-segment-test when the store has no such tag

	WorkerRegistry string // kv | zk | mysql | static
	WorkerID       int64  // with static; -1 = not given
	ZK             string
	ZKName         string
	ZKRecycle      bool
	LeaseTTL       time.Duration

	MaxBatch      int
	Pools         pools.Specs
	Epoch         int64 // snowflake epoch, Unix ms
	DenseSequence bool

	ClockWaitMax time.Duration
	PeerSkewMax  time.Duration
	ClockJumpMax time.Duration
	BorrowMax    time.Duration

	LogLevel  string
	LogFormat string
}

// The heartbeat interval is Leaf's (3 s) and PROTOCOL.md's: not a flag, since the
// start-up wait of a restarted node and the record's meaning depend on it.
const heartbeatInterval = 3 * time.Second

// sampleTag is Leaf's sample row, ready in the embedded default so that the first
// request works.
const (
	sampleTag     = "leaf-segment-test"
	sampleTagStep = 2000
)

func defaultConfig() Config {
	return Config{
		Listen:         "127.0.0.1:4222",
		DataDir:        "./leafbus-data",
		Prefix:         "leaf",
		NodeID:         defaultNodeID(),
		KVReplicas:     1,
		SegmentStore:   "kv",
		SampleTag:      true,
		WorkerRegistry: "kv",
		WorkerID:       -1,
		ZKName:         "leafbus",
		LeaseTTL:       30 * time.Second,
		MaxBatch:       10000,
		Epoch:          snowflake.DefaultLayout().Epoch,
		PeerSkewMax:    5 * time.Second,
		ClockJumpMax:   time.Hour,
		BorrowMax:      time.Second,
		LogLevel:       "info",
		LogFormat:      "text",
	}
}

// flagSet declares every flag on c. The usage text says what each does and its
// environment name.
func (c *Config) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("dispenser", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: dispenser [flags]          serve IDs over NATS
       dispenser tag add|list|update  manage segment tags of a running deployment
       dispenser decode ID            take a snowflake ID apart
       dispenser schema               print the MySQL DDL (Leaf's leaf_alloc)

With no flags it embeds a NATS server with JetStream on 127.0.0.1:4222, keeps segments
and worker-ID leases in JetStream KV under ./leafbus-data, and serves the sample tag
leaf-segment-test. Every flag can also be set in the environment as LEAFBUS_<NAME>
(upper case, dashes as underscores: --mysql-dsn is LEAFBUS_MYSQL_DSN); a flag on the
command line wins.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.Listen, "listen", c.Listen, "client address (host:port) of the embedded NATS server")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the embedded JetStream store and the worker-ID cache file")
	fs.StringVar(&c.Monitor, "monitor", c.Monitor, "HTTP monitoring address (host:port) of the embedded NATS server; off when empty")
	fs.StringVar(&c.NATS, "nats", c.NATS, "comma-separated NATS server URLs to join instead of embedding a server")
	c.Conn.RegisterFlags(fs)
	fs.StringVar(&c.Prefix, "prefix", c.Prefix, "subject prefix; also names the service, queue group, KV buckets and pool stream")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this dispenser's identity (its heartbeat key): 1-64 of A-Z a-z 0-9 _ -")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "ip:port this node registers under with the zk and mysql registries (Leaf's identity); default: first non-loopback IPv4 and --listen's port")
	fs.IntVar(&c.KVReplicas, "kv-replicas", c.KVReplicas, "replicas of the KV buckets and the pool stream (3 on a NATS cluster)")
	fs.StringVar(&c.SegmentStore, "segment-store", c.SegmentStore, "where segments come from: kv (JetStream KV) or mysql (Leaf's leaf_alloc table)")
	fs.StringVar(&c.MySQLDSN, "mysql-dsn", c.MySQLDSN, "go-sql-driver DSN for the mysql segment store and worker registry, e.g. user:pass@tcp(db:3306)/leaf")
	fs.BoolVar(&c.MySQLCreateTable, "mysql-create-table", c.MySQLCreateTable, "create the leaf_alloc (and leaf_workerid_alloc) tables when missing")
	fs.BoolVar(&c.SampleTag, "sample-tag", c.SampleTag, "with the kv store, create the tag leaf-segment-test (step 2000) when it does not exist")
	fs.StringVar(&c.WorkerRegistry, "worker-registry", c.WorkerRegistry, "where the snowflake worker ID comes from: kv (leases), zk (Leaf's layout), mysql or static")
	fs.Int64Var(&c.WorkerID, "worker-id", c.WorkerID, "the worker ID, with --worker-registry static")
	fs.StringVar(&c.ZK, "zk", c.ZK, "ZooKeeper servers host:port[,host:port], with --worker-registry zk")
	fs.StringVar(&c.ZKName, "zk-name", c.ZKName, "Leaf's leaf.name: worker IDs live under /snowflake/<name>/")
	fs.BoolVar(&c.ZKRecycle, "zk-recycle", c.ZKRecycle, "with zk: worker IDs are leases that come back after --lease-ttl of silence")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "how long an unrenewed worker-ID lease lasts (kv registry, zk with --zk-recycle); renewed every 3s")
	fs.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "largest count a request may ask for")
	fs.Var(&c.Pools, "pool", "kind:tag:size:depth: keep depth ready batches of size IDs for bulk consumers (repeatable)")
	fs.Int64Var(&c.Epoch, "epoch", c.Epoch, "snowflake epoch in Unix ms (Leaf's default 1288834974657); never change it for existing IDs")
	fs.BoolVar(&c.DenseSequence, "dense-sequence", c.DenseSequence, "start each millisecond's snowflake sequence at 0 instead of a random 0-99 (Leaf)")
	fs.DurationVar(&c.ClockWaitMax, "clock-wait-max", c.ClockWaitMax, "at start, wait up to this long for the clock to pass its record instead of refusing")
	fs.DurationVar(&c.PeerSkewMax, "peer-skew-max", c.PeerSkewMax, "largest distance from the peers' mean clock at first start")
	fs.DurationVar(&c.ClockJumpMax, "clock-jump-max", c.ClockJumpMax, "a forward clock jump beyond this is logged and not recorded")
	fs.DurationVar(&c.BorrowMax, "borrow-max", c.BorrowMax, "how far ahead of the clock pre-filled snowflake batches may reach")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	return fs
}

// parse reads args, then fills every flag not given on the command line from its
// LEAFBUS_<NAME> environment variable.
func (c *Config) parse(args []string, getenv func(string) string, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))}
	}
	if err := applyEnv(fs, getenv); err != nil {
		return &usageError{err}
	}
	if err := c.Validate(); err != nil {
		return &usageError{err}
	}
	return nil
}

// applyEnv sets each flag that was not on the command line from LEAFBUS_<NAME>. A
// repeatable flag (--pool) takes a comma-separated list.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		name := envName(f.Name)
		v := getenv(name)
		if v == "" {
			return
		}
		values := []string{v}
		if _, repeatable := f.Value.(*pools.Specs); repeatable {
			values = strings.Split(v, ",")
		}
		for _, one := range values {
			if err := fs.Set(f.Name, strings.TrimSpace(one)); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// envName is the environment variable of a flag: --mysql-dsn is LEAFBUS_MYSQL_DSN.
func envName(flagName string) string {
	return "LEAFBUS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Validate checks every setting and every cross-field rule before anything starts,
// naming the flag, its value and what is allowed.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := wire.CheckPrefix(c.Prefix); err != nil {
		errs = append(errs, err)
	}
	if err := workerid.CheckNodeID(c.NodeID); err != nil {
		add("--node-id: %w", err)
	}
	if c.NATS == "" {
		if err := (dispenser.EmbeddedConfig{Listen: c.Listen, DataDir: c.DataDir, Monitor: c.Monitor}).Validate(); err != nil {
			errs = append(errs, err)
		}
	} else {
		c.Conn.URLs = c.NATS
		if err := c.Conn.Validate(); err != nil {
			add("--nats: %w", err)
		}
	}
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
	layout := c.layout()
	if err := layout.Validate(); err != nil {
		add("--epoch %d: %w", c.Epoch, err)
	}
	switch c.WorkerRegistry {
	case "static":
		if c.WorkerID < 0 || c.WorkerID > layout.MaxWorkerID() {
			add("--worker-registry static needs --worker-id from 0 to %d, got %d", layout.MaxWorkerID(), c.WorkerID)
		}
	case "kv":
	case "zk":
		if c.ZK == "" {
			add("--worker-registry zk needs --zk host:port[,host:port]")
		}
		if c.NATS != "" && c.Advertise == "" {
			add("--worker-registry zk with --nats needs --advertise ip:port (the identity this node keeps its worker ID under)")
		}
	case "mysql":
		if c.MySQLDSN == "" {
			add("--worker-registry mysql needs --mysql-dsn")
		}
		if c.NATS != "" && c.Advertise == "" {
			add("--worker-registry mysql with --nats needs --advertise ip:port (the identity this node keeps its worker ID under)")
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
	if c.LeaseTTL < 4*heartbeatInterval {
		add("--lease-ttl %v: want at least 4 heartbeat intervals (%v), so a node stops issuing (at half the TTL) well after a missed renewal", c.LeaseTTL, 4*heartbeatInterval)
	}
	if c.MaxBatch < 1 || c.MaxBatch > wire.MaxBatchLimit {
		add("--max-batch %d: want 1 to %d", c.MaxBatch, wire.MaxBatchLimit)
	}
	for _, p := range c.Pools {
		if p.Size > c.MaxBatch {
			add("--pool %s: batch size %d is over --max-batch %d", p, p.Size, c.MaxBatch)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--clock-wait-max", c.ClockWaitMax}, {"--peer-skew-max", c.PeerSkewMax}, {"--clock-jump-max", c.ClockJumpMax}, {"--borrow-max", c.BorrowMax}} {
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
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		add("--log-format %q: want text or json", c.LogFormat)
	}
	return errors.Join(errs...)
}

func (c *Config) layout() snowflake.Layout {
	l := snowflake.DefaultLayout()
	l.Epoch = c.Epoch
	return l
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func (c *Config) logger(w io.Writer) *slog.Logger {
	level, _ := parseLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// defaultNodeID is the host name with every character a node ID may not hold turned
// into '-', cut to 64.
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

// advertiseAddr is --advertise, or the first non-loopback IPv4 with --listen's port.
func (c *Config) advertiseAddr() (string, error) {
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
