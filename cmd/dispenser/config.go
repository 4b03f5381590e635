package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/pools"
)

// Config is what `dispenser` reads from flags and LEAFBUS_<NAME> environment variables
// (PROTOCOL.md "Running a dispenser": those names are fixed): the dispenser's
// configuration, and how to log.
type Config struct {
	dispenser.Config
	LogLevel  string
	LogFormat string
	// CPUProfile names a file for a pprof CPU profile of the whole run ("" for none):
	// the dispenser as deployed, its embedded NATS server included.
	CPUProfile string

	// ConfigFile is a YAML file of flag values (--config); LeafProperties a Leaf
	// server's leaf.properties (--leaf-properties); PrintConfig prints the result and
	// exits (--print-config). configfile.go and leafprops.go read them.
	ConfigFile     string
	LeafProperties string
	PrintConfig    bool

	sources    map[string]string // where each flag's value came from, for --print-config
	notes      []string          // what --leaf-properties left out, logged at start
	fs         *flag.FlagSet     // the flags, for --print-config
	detectIPv4 func() (string, error)
}

func defaultConfig() Config {
	return Config{Config: dispenser.DefaultConfig(), LogLevel: "info", LogFormat: "text"}
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
       dispenser deployment show|set  show or change the deployment record
       dispenser fence                make a data dir put back from a copy safe to serve
       dispenser reveal --tag T ID    the segment number behind an opaque tag's ID
       dispenser conform              check a deployment against docs/PROTOCOL.md
       dispenser version|--version    print the version and VCS revision

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
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the embedded JetStream store, the worker-ID cache file, the segment high-water marks (segment.marks) and the lock (LOCK) that keeps it to one dispenser")
	fs.StringVar(&c.Monitor, "monitor", c.Monitor, "HTTP monitoring address (host:port) of the embedded NATS server; off when empty")
	fs.StringVar(&c.NATS, "nats", c.NATS, "comma-separated NATS server URLs to join instead of embedding a server")
	c.Conn.RegisterFlags(fs)
	c.registerSecurityFlags(fs)
	fs.StringVar(&c.Prefix, "prefix", c.Prefix, "subject prefix; also names the service, queue group, KV buckets and pool stream")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this dispenser's identity (its heartbeat key): 1-64 of A-Z a-z 0-9 _ -")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "ip:port this node registers under with the zk and mysql registries (Leaf's identity); default: first non-loopback IPv4 and --listen's port")
	fs.IntVar(&c.KVReplicas, "kv-replicas", c.KVReplicas, "replicas of the KV buckets and the pool stream (3 on a NATS cluster)")
	fs.StringVar(&c.SegmentStore, "segment-store", c.SegmentStore, "where segments come from: kv (JetStream KV) or mysql (Leaf's leaf_alloc table)")
	fs.StringVar(&c.MySQLDSN, "mysql-dsn", c.MySQLDSN, "go-sql-driver DSN for the mysql segment store and worker registry, e.g. user:pass@tcp(db:3306)/leaf")
	fs.BoolVar(&c.MySQLCreateTable, "mysql-create-table", c.MySQLCreateTable, "create the leaf_alloc (and leaf_workerid_alloc) tables when missing")
	fs.BoolVar(&c.SampleTag, "sample-tag", c.SampleTag, "with the kv store, create the tag leaf-segment-test (step 2000) when it does not exist, in a --data-dir never used for segments only")
	fs.BoolVar(&c.AllowStoreBehind, "allow-store-behind", c.AllowStoreBehind, "start although the segment store lost or rewound tags this node served (below its high-water marks in --data-dir): those tags answer 503 until their max_id is raised (dispenser tag update --max-id N), the others serve")
	fs.StringVar(&c.WorkerRegistry, "worker-registry", c.WorkerRegistry, "where the snowflake worker ID comes from: kv (leases), zk (Leaf's layout), mysql or static")
	fs.Int64Var(&c.WorkerID, "worker-id", c.WorkerID, "the worker ID, with --worker-registry static")
	fs.StringVar(&c.ZK, "zk", c.ZK, "ZooKeeper servers host:port[,host:port], with --worker-registry zk")
	fs.StringVar(&c.ZKName, "zk-name", c.ZKName, "Leaf's leaf.name: worker IDs live under /snowflake/<name>/")
	fs.BoolVar(&c.ZKRecycle, "zk-recycle", c.ZKRecycle, "with zk: worker IDs are leases that come back after --lease-ttl of silence")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "how long an unrenewed worker-ID lease lasts (kv registry, zk with --zk-recycle); renewed with every clock record, each second")
	fs.DurationVar(&c.MonotonicLeaseTTL, "monotonic-lease-ttl", c.MonotonicLeaseTTL, "lease of the leader of a monotonic tag, renewed every sixth; a killed leader's tags answer 503 for about this long (the same on every dispenser)")
	fs.Int64Var(&c.WorkerIDMin, "worker-id-min", c.WorkerIDMin, "lowest worker ID this deployment may use: give each datacenter a range of its own, disjoint from the others'")
	fs.Int64Var(&c.WorkerIDMax, "worker-id-max", c.WorkerIDMax, "highest worker ID this deployment may use (at most the layout's highest: 1023 with leaf, 31 with js53; 1023 means the layout's highest)")
	fs.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "largest count a request may ask for")
	fs.Var(&c.Pools, "pool", "kind:tag:size:depth: keep depth ready batches of size IDs for bulk consumers (repeatable)")
	fs.Int64Var(&c.Epoch, "epoch", c.Epoch, "snowflake epoch in Unix ms (Leaf's default 1288834974657); never change it for existing IDs")
	fs.StringVar(&c.SnowflakeLayout, "snowflake-layout", c.SnowflakeLayout, "snowflake bit layout: leaf (Leaf's 41+10+12: 1024 worker IDs, 4096 IDs per ms per worker) or js53 (41+5+7: every ID at most 2^53-1, which JavaScript holds exactly; 32 worker IDs, 128 IDs per ms per worker); the same on every dispenser, never changed for existing IDs")
	fs.BoolVar(&c.DenseSequence, "dense-sequence", c.DenseSequence, "start each millisecond's snowflake sequence at 0 instead of a random 0-99 (Leaf)")
	fs.DurationVar(&c.ClockWaitMax, "clock-wait-max", c.ClockWaitMax, "at start, wait up to this long for the clock to pass its record instead of refusing")
	fs.DurationVar(&c.PeerSkewMax, "peer-skew-max", c.PeerSkewMax, "at first start, refuse when most peers' clocks (a strict majority of this service's dispensers) read further than this from this node's")
	fs.DurationVar(&c.ClockJumpMax, "clock-jump-max", c.ClockJumpMax, "a forward clock jump beyond this is logged and not recorded")
	fs.DurationVar(&c.BorrowMax, "borrow-max", c.BorrowMax, "how far ahead of the clock pre-filled snowflake batches may reach")
	fs.StringVar(&c.HTTP, "http", c.HTTP, "HTTP listener host:port: Leaf's HTTP API, the status page, /metrics, /healthz, /readyz; empty turns it off. When not given and the default is taken, the dispenser warns and serves without HTTP")
	fs.StringVar(&c.MonitorListen, "monitor-listen", c.MonitorListen, "the operator pages' own HTTP listener host:port: the status page, /cache, /db and /metrics move there (with every opaque tag's counters), and --http keeps the ID API and /healthz, /readyz; empty: all on --http, opaque tags' counters left out")
	fs.StringVar(&c.IDKeyFile, "id-key-file", c.IDKeyFile, "file holding the ID key of opaque tags as 32-128 hex digits (openssl rand -hex 32), the same on every dispenser; or give the key itself in "+dispenser.IDKeyEnv+" (no flag). Without either, opaque tags are refused")
	fs.IntVar(&c.HTTPMaxConns, "http-max-conns", c.HTTPMaxConns, "most HTTP connections open at once: at the cap a new one closes the one idle longest, or is refused with 503 when every one has a request in progress; lowered to leave 1024 descriptors (half of a smaller open file limit) to NATS, the stores and files")
	fs.IntVar(&c.MetricsMaxTags, "metrics-max-tags", c.MetricsMaxTags, "per-tag segment metrics name the busiest this many tags; the rest are summed as tag=\"_other\"")
	fs.DurationVar(&c.StartTimeout, "start-timeout", c.StartTimeout, "at start, wait up to this long for NATS/JetStream, the segment store and the worker-ID registry to become ready (0: refuse at the first failure)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.StringVar(&c.CPUProfile, "cpuprofile", c.CPUProfile, "write a pprof CPU profile of the whole run, from start to stop, to this `file` (go tool pprof)")
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "a YAML `file` of settings, each key a flag's name (pool: a list); flags and LEAFBUS_* win over it")
	fs.StringVar(&c.LeafProperties, "leaf-properties", c.LeafProperties, "a Leaf server's leaf.properties `file`: start as that server would have (MySQL store on leaf.jdbc.url, ZooKeeper registry under leaf.name, HTTP on leaf.snowflake.port); every other source wins over it")
	fs.BoolVar(&c.PrintConfig, "print-config", c.PrintConfig, "print the configuration in effect (as a --config file, each value's source in a comment, secrets masked) and exit")
	return fs
}

// parse reads args, then fills every flag not given on the command line from its
// LEAFBUS_<NAME> environment variable.
func (c *Config) parse(args []string, getenv func(string) string, stderr io.Writer) error {
	return c.parseFlags(c.flagSet(stderr), args, getenv)
}

// parseFlags is parse on fs: the serve flags and, for a subcommand that takes them
// (admin.go), its own.
func (c *Config) parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))}
	}
	given := map[string]string{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = "--" + f.Name })
	if err := applyEnv(fs, getenv); err != nil {
		return &usageError{err}
	}
	fs.Visit(func(f *flag.Flag) {
		if _, ok := given[f.Name]; !ok {
			given[f.Name] = envName(f.Name)
		}
	})
	if err := c.applyFiles(fs, given); err != nil {
		return &usageError{err}
	}
	c.sources, c.fs = given, fs
	// The ID key itself comes from the environment only, never the command line.
	c.IDKey = getenv(dispenser.IDKeyEnv)
	// Only an address the operator gave (flag, environment or a file) must be bound to
	// start.
	fs.Visit(func(f *flag.Flag) { c.HTTPExplicit = c.HTTPExplicit || f.Name == "http" })
	if err := errors.Join(c.Validate(), c.checkGiven(fs)); err != nil {
		return &usageError{err}
	}
	return nil
}

// applyFiles sets the flags neither the command line nor the environment set, from the
// --config file, then from --leaf-properties (whose path may come from either).
func (c *Config) applyFiles(fs *flag.FlagSet, given map[string]string) error {
	if c.ConfigFile != "" {
		values, err := readConfigFile(c.ConfigFile, fs)
		if err != nil {
			return err
		}
		if err := applyValues(fs, values, given, func(string) string { return "--config " + c.ConfigFile }); err != nil {
			return err
		}
	}
	if c.LeafProperties == "" {
		return nil
	}
	ip := c.detectIPv4
	if ip == nil {
		ip = firstIPv4
	}
	lp, err := readLeafProperties(c.LeafProperties, ip)
	if err != nil {
		return err
	}
	// A kind whose source a stronger layer chose otherwise keeps none of Leaf's settings
	// for it: --worker-registry kv on the command line drops Leaf's ZooKeeper settings.
	if _, ok := given["worker-registry"]; ok && c.WorkerRegistry != "zk" {
		for _, name := range []string{"worker-registry", "zk", "zk-name", "advertise"} {
			delete(lp.flags, name)
		}
	}
	if _, ok := given["segment-store"]; ok && c.SegmentStore != "mysql" {
		delete(lp.flags, "segment-store")
		if c.WorkerRegistry != "mysql" {
			delete(lp.flags, "mysql-dsn")
		}
	}
	values := map[string][]string{}
	for name, v := range lp.flags {
		values[name] = []string{v}
	}
	c.notes = lp.notes
	return applyValues(fs, values, given, func(name string) string { return lp.source[name] })
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
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, masked(f.Name, v), err))
			}
		}
	})
	return errors.Join(errs...)
}

// envName is the environment variable of a flag: --mysql-dsn is LEAFBUS_MYSQL_DSN.
func envName(flagName string) string {
	return "LEAFBUS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Validate checks the dispenser's configuration and the log flags, reporting every
// mistake.
func (c *Config) Validate() error {
	errs := []error{c.Config.Validate()}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: want text or json", c.LogFormat))
	}
	return errors.Join(errs...)
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
