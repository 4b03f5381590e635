package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
)

// ErrInvalidConfig is returned by parseFlags and Config.Validate when a flag is missing,
// out of range or contradicts another; the message names the flags and values.
var ErrInvalidConfig = errors.New("invalid configuration")

// Config is one bench run, as the flags describe it.
type Config struct {
	Conn client.ConnConfig // --nats and the credential and TLS flags, as the dispenser takes them
	// InboxPrefix is the subject prefix of the load clients' reply inboxes; "" is
	// nats.go's _INBOX. A user that may subscribe to its own inboxes only (in
	// deploy/nats-roles.conf, client-a to _INBOX_client-a.>) needs it.
	InboxPrefix string
	Embedded    bool // start a dispenser in this process instead of using --nats
	// HTTP is the base URL of a server with Leaf's HTTP API to load instead of NATS
	// (leafbus's gateway, Leaf itself); "" loads NATS.
	HTTP string

	// StoreDelay, with Embedded, slows every segment store call down by this much.
	StoreDelay time.Duration
	// CPUProfile names a file for a pprof CPU profile of the run ("" for none).
	CPUProfile string
	// CPUPIDs are other processes (label -> pid, e.g. "dispenser") whose CPU time per
	// request each phase reports, beside this bench's and an echo process's.
	CPUPIDs map[string]int

	Kind     wire.Kind     // segment or snowflake
	Tags     []string      // requests go round robin over these
	Batch    int           // IDs per request; 1 sends an empty body, as a plain client does
	Encoding wire.Encoding // of the replies (the Leaf-Encoding header)
	Prefix   string        // subject prefix of the deployment

	Clients  int     // NATS connections, each a client of its own
	Inflight int     // closed loop: requests each client keeps outstanding
	Rate     float64 // open loop when > 0: requests per second over all clients

	Warmup   time.Duration // sent and checked but not measured
	Duration time.Duration // measured time after Warmup; 0 means until Requests or interrupted
	Requests int64         // measured requests; 0 means until Duration
	Timeout  time.Duration // a reply later than this counts as a timeout

	JSON       bool   // one JSON object on stdout instead of the table
	Check      bool   // keep every ID and look for duplicates
	CheckSpill string // with Check: directory for sorted runs, bounding memory
	CheckMem   int    // with CheckSpill: IDs held in memory before a run is written

	// Baseline lists the bare NATS responders to repeat the load against, comma
	// separated: "echo" runs them inside this process, "echo-process" in a process of
	// their own (`bench echo`), as a dispenser is deployed; "" for none.
	Baseline       string
	Rounds         int    // the measured part cut into rounds in which the phases take turns
	EchoResponders int    // echo subscriptions; 0 means as many as the dispenser service has
	EchoAt         string // with echo-process: the subject prefix of a `bench echo` already running

	exe string // the binary `bench echo` runs from; "" is this one (tests set their own)
}

// Baselines of --baseline.
const (
	baselineEcho        = "echo"         // responders in the bench process
	baselineEchoProcess = "echo-process" // responders in a `bench echo` process
)

// baselines splits Baseline into its names, in the order they run.
func (c Config) baselines() []string { return splitList(c.Baseline) }

func defaultConfig() Config {
	return Config{
		Conn:     client.ConnConfig{URLs: "nats://127.0.0.1:4222"},
		Kind:     wire.Segment,
		Tags:     []string{"leaf-segment-test"},
		Batch:    1,
		Encoding: wire.Text,
		Prefix:   wire.DefaultPrefix,
		Clients:  4,
		Inflight: 8,
		Warmup:   time.Second,
		Duration: 10 * time.Second,
		Timeout:  2 * time.Second,
		Rounds:   1,
		CheckMem: 16 << 20,
	}
}

const usageIntro = `bench loads a leafbus deployment over NATS request/reply, as real clients would,
and reports throughput, errors by code and latency percentiles.

  bench [flags]                            10 s of closed-loop load on leaf.segment.leaf-segment-test
  bench --rate 20000 --duration 30s        open loop: 20,000 requests/s whatever the latency
  bench --check --baseline echo            also look for duplicate IDs, and compare with a bare
                                           NATS responder on the same server (the headline ratio)
  bench --http http://127.0.0.1:8080       the same load on a Leaf-compatible HTTP server
                                           (leafbus's gateway, Leaf, another port of Leaf's API)
  bench --baseline echo,echo-process       compare with the responder in this process and in a
                                           process of its own, as a dispenser is deployed
  bench echo --help                        the responder alone, to start by hand (--echo-at)
  bench http-echo --listen 127.0.0.1:18090 a bare net/http server answering a fresh number:
                                           the baseline of the HTTP face, for wrk (BENCHMARKS.md)
  bench --baseline echo,echo-process --rounds 6 --duration 30s --cpu-pid dispenser=PID
                                           six turns each, ratios per round, and the CPU per
                                           request of the dispenser's process, the bench's
                                           and the echo process's

Closed loop (the default): each of --clients connections keeps --inflight requests
outstanding and sends the next as soon as one completes. Open loop (--rate): requests are
sent on a fixed timetable that never waits for replies, and latency is measured from
when each request was due, so a stalled server shows as latency, not as fewer requests.

Exit status: 0 done; 1 duplicate IDs (--check) or IDs out of order inside a reply;
2 bad flags or the run could not be carried out.

Flags:
`

// envFlags are the flags bench also takes from the environment as LEAFBUS_<NAME>
// (--inbox-prefix from LEAFBUS_INBOX_PREFIX), when it loads NATS and the command line
// does not give them: where the deployment is and who connects, the variables the
// dispenser and its decode and tag commands read too, so that one role's environment
// serves every tool and no password need be on a command line. The load's own flags
// stay on the command line: LEAFBUS_HTTP, for one, is a dispenser's listener, not a
// server to load.
var envFlags = []string{"nats", "prefix", "inbox-prefix", "user", "password", "token", "nkey", "creds", "tls-ca", "tls-cert", "tls-key"}

// envName is the environment variable of a flag: --inbox-prefix is LEAFBUS_INBOX_PREFIX.
func envName(flagName string) string {
	return "LEAFBUS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets each of envFlags that set (the flags on the command line) lacks from
// its variable, when that is not empty.
func applyEnv(fs *flag.FlagSet, set map[string]bool, getenv func(string) string) error {
	for _, name := range envFlags {
		v := getenv(envName(name))
		if set[name] || v == "" {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalidConfig, envName(name), err)
		}
	}
	return nil
}

// parseFlags turns the command line, and the environment read by getenv (envFlags),
// into a validated Config. It returns flag.ErrHelp after printing the help for
// -h/--help.
func parseFlags(args []string, output io.Writer, getenv func(string) string) (Config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageIntro)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Conn.URLs, "nats", cfg.Conn.URLs, "NATS server URL(s) of the deployment, comma separated (this and the credential, TLS, --prefix and --inbox-prefix flags also from LEAFBUS_<NAME>, e.g. LEAFBUS_PASSWORD)")
	cfg.Conn.RegisterFlags(fs)
	fs.BoolVar(&cfg.Embedded, "embedded", false, "start a dispenser (with its own NATS server) inside bench and load it; excludes --nats")
	fs.StringVar(&cfg.HTTP, "http", "", "load a server with Leaf's HTTP API at this base `URL` instead of NATS: GET /api/segment/get/{tag} and /api/snowflake/get/{tag}, ?count=N for --batch; text replies only")
	fs.DurationVar(&cfg.StoreDelay, "store-delay", 0, "with --embedded: delay every segment store call by this much, as a slow database would")

	shape := registerIDShape(fs, &cfg, idShapeUsage{
		kind:     "ID `kind`: segment or snowflake",
		tags:     "comma separated biz `tags`; requests go round robin over them",
		encoding: "reply encoding: text, or binary (sent as header Leaf-Encoding: binary)",
	})
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "IDs per request; 1 sends an empty body as a plain client does")
	fs.StringVar(&cfg.Prefix, "prefix", cfg.Prefix, "subject prefix of the deployment (the dispenser's --prefix)")
	fs.StringVar(&cfg.InboxPrefix, "inbox-prefix", "", "subject `prefix` of the clients' reply inboxes instead of _INBOX, for a NATS user that may only subscribe to its own (deploy/nats-roles.conf: _INBOX_<user>)")

	fs.IntVar(&cfg.Clients, "clients", cfg.Clients, "client connections; each is its own NATS connection with its own reply inbox")
	fs.IntVar(&cfg.Inflight, "inflight", cfg.Inflight, "closed loop: requests each client keeps outstanding (pipelined)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop: a fixed `rate` of requests per second over all clients, sent on a timetable that never waits for replies (0: closed loop)")

	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "load before measuring; its replies are checked but not counted")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured time after the warm-up; 0 runs until --requests or Ctrl-C (--requests alone turns this default off)")
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after this many measured requests (0: use --duration)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "per request: a reply later than this (in open loop: after the request was due) counts as a timeout")

	fs.BoolVar(&cfg.JSON, "json", false, "print one JSON object with every number instead of the table")
	fs.BoolVar(&cfg.Check, "check", false, "keep every ID, report duplicates and per-client regressions of segment IDs")
	fs.StringVar(&cfg.CheckSpill, "check-spill", "", "with --check: `dir`ectory for sorted runs of IDs, so memory stays bounded by --check-mem (exact, for huge runs)")
	fs.IntVar(&cfg.CheckMem, "check-mem", cfg.CheckMem, "with --check-spill: IDs held in memory (8 bytes each) before a sorted run is written")

	registerComparisonFlags(fs, &cfg)

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected argument %q", ErrInvalidConfig, fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !cfg.Embedded && cfg.HTTP == "" {
		if err := applyEnv(fs, set, getenv); err != nil {
			return cfg, err
		}
	}
	if err := shape.apply(&cfg); err != nil {
		return cfg, err
	}
	if set["requests"] && !set["duration"] {
		cfg.Duration = 0
	}
	if err := checkFlagsTogether(cfg, set); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// idShape is the flags that say which IDs the requests ask for, held as text until the
// command line is parsed: bench and `bench echo` read them alike.
type idShape struct{ kind, tags, encoding string }

// idShapeUsage is each command's help text for the idShape flags.
type idShapeUsage struct{ kind, tags, encoding string }

// registerIDShape adds --kind, --tags and --encoding, defaulting to cfg's values.
func registerIDShape(fs *flag.FlagSet, cfg *Config, usage idShapeUsage) *idShape {
	s := &idShape{kind: cfg.Kind.String(), tags: strings.Join(cfg.Tags, ","), encoding: cfg.Encoding.String()}
	fs.StringVar(&s.kind, "kind", s.kind, usage.kind)
	fs.StringVar(&s.tags, "tags", s.tags, usage.tags)
	fs.StringVar(&s.encoding, "encoding", s.encoding, usage.encoding)
	return s
}

// apply parses the flags into cfg, naming the flag of a bad value.
func (s *idShape) apply(cfg *Config) error {
	cfg.Tags = splitList(s.tags)
	var err error
	if cfg.Kind, err = wire.ParseKind(s.kind); err != nil {
		return fmt.Errorf("%w: --kind %q must be segment or snowflake", ErrInvalidConfig, s.kind)
	}
	if cfg.Encoding, err = wire.ParseEncoding(s.encoding); err != nil {
		return fmt.Errorf("%w: --encoding %q must be text or binary", ErrInvalidConfig, s.encoding)
	}
	return nil
}

// checkFlagsTogether refuses flags that contradict each other, or that only mean
// something beside another; set holds the flags given on the command line.
func checkFlagsTogether(cfg Config, set map[string]bool) error {
	if cfg.Embedded && set["nats"] {
		return fmt.Errorf("%w: --embedded starts its own server; drop --nats %q", ErrInvalidConfig, client.RedactURLs(cfg.Conn.URLs))
	}
	if cfg.HTTP != "" && (set["nats"] || cfg.Embedded) {
		return fmt.Errorf("%w: --http %s loads an HTTP server; drop --nats and --embedded", ErrInvalidConfig, cfg.HTTP)
	}
	if set["store-delay"] && !cfg.Embedded {
		return fmt.Errorf("%w: --store-delay %v slows the store of an --embedded dispenser only", ErrInvalidConfig, cfg.StoreDelay)
	}
	if cfg.StoreDelay < 0 {
		return fmt.Errorf("%w: --store-delay %v is negative", ErrInvalidConfig, cfg.StoreDelay)
	}
	if cfg.Rate > 0 && set["inflight"] {
		return fmt.Errorf("%w: --inflight %d applies to the closed loop only, not with --rate %v", ErrInvalidConfig, cfg.Inflight, cfg.Rate)
	}
	if set["inbox-prefix"] && cfg.HTTP != "" {
		return fmt.Errorf("%w: --inbox-prefix %q names NATS reply inboxes; --http has none", ErrInvalidConfig, cfg.InboxPrefix)
	}
	if set["check-mem"] && cfg.CheckSpill == "" {
		return fmt.Errorf("%w: --check-mem %d needs --check-spill", ErrInvalidConfig, cfg.CheckMem)
	}
	return nil
}

// validateTransport checks the connection flags of the transport that will be loaded:
// NATS (unless --embedded), or --http, which neither has binary replies nor a bare
// responder to compare with.
func (c Config) validateTransport() error {
	switch {
	case c.HTTP == "" && !c.Embedded:
		return c.Conn.Validate()
	case c.HTTP == "":
		return nil
	case c.Encoding != wire.Text:
		return fmt.Errorf("--encoding %s: Leaf's HTTP API answers text only", c.Encoding)
	case c.Baseline != "":
		return fmt.Errorf("--baseline %s compares with a NATS responder; it does not apply to --http", c.Baseline)
	}
	return checkHTTPBase(c.HTTP)
}

// registerComparisonFlags adds the flags that compare and explain: the baselines, the
// rounds, and where the CPU goes.
func registerComparisonFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.Baseline, "baseline", "", "`names`: echo, echo-process or both (comma separated): also run the same load against a bare NATS responder that answers with a same-size canned reply, in this process (echo) or in a 'bench echo' process of its own (echo-process), and print dispenser/echo ratios")
	fs.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "with --baseline: cut --duration (or --requests) into this many rounds in which the dispenser and each baseline take turns, so that the host's busy spells hit every phase alike; each round's ratio and their median are reported")
	fs.IntVar(&cfg.EchoResponders, "echo-responders", 0, "echo subscriptions, each on its own connection (0: as many endpoint instances as $SRV.INFO.<prefix> shows serving the subject, at least 1)")
	fs.StringVar(&cfg.EchoAt, "echo-at", "", "with --baseline echo-process: the --subject of a 'bench echo' already running (started by hand, maybe elsewhere) instead of starting one")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a pprof CPU profile of the whole run (with --embedded, the dispenser's too) to this `file`")
	fs.Func("cpu-pid", "`[label=]pid` of a process (the dispenser's) whose CPU time per request to report with this bench's; repeatable (Linux)", func(v string) error {
		label, pid, err := parseCPUPID(v)
		if err == nil {
			if cfg.CPUPIDs == nil {
				cfg.CPUPIDs = map[string]int{}
			}
			cfg.CPUPIDs[label] = pid
		}
		return err
	})
}

// parseCPUPID reads --cpu-pid: "dispenser=1234", or "1234" labelled "pid 1234".
func parseCPUPID(v string) (string, int, error) {
	label, num, named := strings.Cut(v, "=")
	if !named {
		num, label = v, "pid "+v
	}
	pid, err := strconv.Atoi(num)
	if err != nil || pid < 1 || label == "" || label == cpuBench || label == cpuEcho {
		return "", 0, fmt.Errorf("%q: want [label=]pid with a pid > 0 and a label other than %q and %q", v, cpuBench, cpuEcho)
	}
	return label, pid, nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// checkSubjects checks the subjects given by flag: --echo-at and --inbox-prefix.
func (c Config) checkSubjects() error {
	if c.EchoAt != "" {
		if err := checkPlainSubject(c.EchoAt); err != nil {
			return fmt.Errorf("--echo-at: %w", err)
		}
	}
	if c.InboxPrefix != "" {
		if err := checkPlainSubject(c.InboxPrefix); err != nil {
			return fmt.Errorf("--inbox-prefix: %w", err)
		}
		// The dispenser drops replies aimed at its own subjects or at $ subjects: every
		// request would time out.
		if !(wire.Subjects{Prefix: c.Prefix}).ReplyAllowed(c.InboxPrefix + ".x") {
			return fmt.Errorf("--inbox-prefix %q: the dispenser never answers on it (PROTOCOL.md \"Reply subjects\")", c.InboxPrefix)
		}
	}
	return nil
}

// Validate checks every field, naming the flag, its value and the bound it breaks.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if err := c.validateTransport(); err != nil {
		return bad("%v", err)
	}
	switch {
	case c.Kind != wire.Segment && c.Kind != wire.Snowflake:
		return bad("--kind %d is neither segment nor snowflake", c.Kind)
	case len(c.Tags) == 0:
		return bad("--tags gives no tag")
	case c.Batch < 1:
		return bad("--batch %d must be at least 1", c.Batch)
	case c.Encoding != wire.Text && c.Encoding != wire.Binary:
		return bad("--encoding %d is neither text nor binary", c.Encoding)
	case c.Clients < 1:
		return bad("--clients %d must be at least 1", c.Clients)
	case c.Inflight < 1:
		return bad("--inflight %d must be at least 1", c.Inflight)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return bad("--rate %v must be a positive number of requests per second, or 0 for the closed loop", c.Rate)
	case c.Warmup < 0:
		return bad("--warmup %v must not be negative", c.Warmup)
	case c.Duration < 0:
		return bad("--duration %v must not be negative", c.Duration)
	case c.Requests < 0:
		return bad("--requests %d must not be negative", c.Requests)
	case c.Timeout <= 0:
		return bad("--timeout %v must be positive", c.Timeout)
	case c.CheckSpill != "" && !c.Check:
		return bad("--check-spill %q needs --check", c.CheckSpill)
	case c.CheckMem < 1:
		return bad("--check-mem %d must be at least 1", c.CheckMem)
	case c.Rounds < 1:
		return bad("--rounds %d must be at least 1", c.Rounds)
	case c.Rounds > 1 && (c.Baseline == "" || c.Check || (c.Duration == 0 && c.Requests == 0)):
		return bad("--rounds %d takes turns with a --baseline, over a --duration or --requests, without --check", c.Rounds)
	case c.Rounds > 1 && c.Duration == 0 && c.Requests < int64(c.Rounds):
		// A round of 0 requests and no duration would never end.
		return bad("--requests %d cannot be cut into --rounds %d: want at least one request a round", c.Requests, c.Rounds)
	case c.EchoResponders < 0:
		return bad("--echo-responders %d must not be negative", c.EchoResponders)
	case c.EchoResponders > 0 && c.Baseline == "":
		return bad("--echo-responders %d needs --baseline echo", c.EchoResponders)
	case c.EchoAt != "" && !slices.Contains(c.baselines(), baselineEchoProcess):
		return bad("--echo-at %q needs --baseline echo-process", c.EchoAt)
	}
	if err := c.checkSubjects(); err != nil {
		return bad("%v", err)
	}
	seen := map[string]bool{}
	for _, b := range c.baselines() {
		if (b != baselineEcho && b != baselineEchoProcess) || seen[b] {
			return bad("--baseline %q: want echo, echo-process or echo,echo-process", c.Baseline)
		}
		seen[b] = true
	}
	// A bad prefix or tag would only earn timeouts or 400s: say so before starting.
	if err := wire.CheckPrefix(c.Prefix); err != nil {
		return bad("%v", err)
	}
	for _, tag := range c.Tags {
		if err := wire.CheckTag(tag); err != nil {
			return bad("--tags: %v", err)
		}
	}
	return nil
}
