package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// The echo baseline in a process of its own. A dispenser is deployed as its own process,
// with its own runtime, scheduler and garbage collector; an echo inside the bench shares
// all three with the load clients. `bench echo` is the bare responder alone: started by
// `bench --baseline echo-process` (which stops it by closing its standard input), or by
// hand and named with --echo-at.

// echoReadyWait bounds how long bench waits for a `bench echo` it started to serve.
const echoReadyWait = 30 * time.Second

// A `bench echo` started by bench takes the secrets from its environment rather than
// its command line, which every user of the machine can read: the password, the token,
// and the server URLs, which may carry either (nats://user:password@host).
const (
	envEchoPassword = "LEAFBUS_BENCH_PASSWORD"
	envEchoToken    = "LEAFBUS_BENCH_TOKEN"
	envEchoNATS     = "LEAFBUS_BENCH_NATS"
)

// echoConfig is `bench echo`: the load's shape (Conn, Prefix, Kind, Tags, Batch,
// Encoding, Timeout), whose replies it samples once from the dispenser, and how to serve.
type echoConfig struct {
	Config
	Responders int    // subscriptions, each on its own connection
	Subject    string // requests for a tag come to Subject.<tag>
	UntilEOF   bool   // stop when standard input closes (bench started it)
}

const echoUsage = `bench echo is the bare NATS responder of the echo baseline, in a process of its
own. It asks the dispenser once per tag for a reply of the load's shape, then answers
every request on <subject>.<tag> with that reply's bytes until it is interrupted.

  bench echo --nats URL --subject _bench.echo.x      then, elsewhere:
  bench --nats URL --baseline echo-process --echo-at _bench.echo.x

The NATS password and token may also come from $LEAFBUS_BENCH_PASSWORD and
$LEAFBUS_BENCH_TOKEN. It prints "ready <subject>" once it serves.

Flags:
`

// parseEchoFlags turns `bench echo`'s command line into a validated echoConfig.
func parseEchoFlags(args []string, output io.Writer) (echoConfig, error) {
	ec := echoConfig{Config: defaultConfig(), Responders: 1}
	fs := flag.NewFlagSet("bench echo", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), echoUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&ec.Conn.URLs, "nats", ec.Conn.URLs, "NATS server URL(s), comma separated")
	ec.Conn.RegisterFlags(fs)
	fs.StringVar(&ec.Prefix, "prefix", ec.Prefix, "subject prefix of the dispenser to sample replies from")
	shape := registerIDShape(fs, &ec.Config, idShapeUsage{
		kind:     "ID `kind` of the sampled replies: segment or snowflake",
		tags:     "comma separated biz `tags`; one canned reply each",
		encoding: "encoding of the sampled replies: text or binary",
	})
	fs.IntVar(&ec.Batch, "batch", ec.Batch, "IDs per sampled reply")
	fs.DurationVar(&ec.Timeout, "timeout", ec.Timeout, "for the sample requests")
	fs.IntVar(&ec.Responders, "responders", ec.Responders, "responders, each a queue subscription on its own connection")
	fs.StringVar(&ec.Subject, "subject", "", "subject prefix to serve (default: a new _bench.echo.<unique>)")
	fs.BoolVar(&ec.UntilEOF, "until-stdin-eof", false, "also stop when standard input closes (how bench stops the echo it started)")
	if err := fs.Parse(args); err != nil {
		return ec, err
	}
	if fs.NArg() > 0 {
		return ec, fmt.Errorf("%w: unexpected argument %q", ErrInvalidConfig, fs.Arg(0))
	}
	if err := shape.apply(&ec.Config); err != nil {
		return ec, err
	}
	if v := os.Getenv(envEchoNATS); v != "" && !flagSet(fs, "nats") {
		ec.Conn.URLs = v
	}
	if ec.Conn.Password == "" {
		ec.Conn.Password = os.Getenv(envEchoPassword)
	}
	if ec.Conn.Token == "" {
		ec.Conn.Token = os.Getenv(envEchoToken)
	}
	if ec.Subject == "" {
		ec.Subject = newEchoPrefix()
	}
	if ec.Responders < 1 {
		return ec, fmt.Errorf("%w: --responders %d must be at least 1", ErrInvalidConfig, ec.Responders)
	}
	if err := checkPlainSubject(ec.Subject); err != nil {
		return ec, fmt.Errorf("%w: --subject: %v", ErrInvalidConfig, err)
	}
	return ec, ec.Validate()
}

// checkPlainSubject accepts a subject prefix of plain tokens: no wildcards, no white
// space, no empty token.
func checkPlainSubject(s string) error {
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("%q is not a subject of plain tokens", s)
		}
	}
	return nil
}

// echoMain is `bench echo`: sample, serve, and stop on ctx or (with --until-stdin-eof)
// when stdin closes. It returns the exit status.
func echoMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ec, err := parseEchoFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench echo:", err)
		return exitTrouble
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	echo, err := startSampledEcho(ec, logger)
	if err != nil {
		fmt.Fprintln(stderr, "bench echo:", err)
		return exitTrouble
	}
	defer echo.stop()
	fmt.Fprintf(stdout, "ready %s\n", ec.Subject)
	eof := make(chan struct{})
	if ec.UntilEOF {
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			close(eof)
		}()
	}
	select {
	case <-ctx.Done():
	case <-eof:
	}
	return exitOK
}

// startSampledEcho asks the dispenser for one reply per tag and serves them.
func startSampledEcho(ec echoConfig, logger *slog.Logger) (*echoServer, error) {
	cl, err := connect(ec.Conn, "", "leafbus-bench-echo-sampler", logger)
	if err != nil {
		return nil, err
	}
	defer closeClients([]*benchConn{cl})
	subjects := wire.Subjects{Prefix: ec.Prefix}
	spec := newLoadSpec(ec.Config, "echo", func(tag string) string { return subjects.IDs(ec.Kind, tag) })
	payloads, err := sampleReplies(cl.nc, spec)
	if err != nil {
		return nil, err
	}
	return startEcho(ec.Conn, subjects, ec.Subject, ec.Tags, payloads, ec.Responders, logger)
}

// echoChildArgs is the command line of a `bench echo` serving cfg's load on subject;
// the server URLs, password and token go in the environment (echoChildEnv).
func echoChildArgs(cfg Config, subject string, responders int) []string {
	args := []string{"echo", "--until-stdin-eof", "--subject", subject,
		"--responders", strconv.Itoa(responders),
		"--prefix", cfg.Prefix, "--kind", cfg.Kind.String(), "--tags", strings.Join(cfg.Tags, ","),
		"--batch", strconv.Itoa(cfg.Batch), "--encoding", cfg.Encoding.String(), "--timeout", cfg.Timeout.String()}
	for _, f := range []struct{ name, value string }{
		{"user", cfg.Conn.User}, {"nkey", cfg.Conn.NKeySeedFile}, {"creds", cfg.Conn.CredsFile},
		{"tls-ca", cfg.Conn.TLSCA}, {"tls-cert", cfg.Conn.TLSCert}, {"tls-key", cfg.Conn.TLSKey},
	} {
		if f.value != "" {
			args = append(args, "--"+f.name, f.value)
		}
	}
	return args
}

func echoChildEnv(cfg Config) []string {
	env := append(os.Environ(), envEchoNATS+"="+cfg.Conn.URLs)
	if cfg.Conn.Password != "" {
		env = append(env, envEchoPassword+"="+cfg.Conn.Password)
	}
	if cfg.Conn.Token != "" {
		env = append(env, envEchoToken+"="+cfg.Conn.Token)
	}
	return env
}

// echoProcess is a `bench echo` this bench started.
type echoProcess struct {
	prefix string
	cmd    *exec.Cmd
	stdin  io.Closer
	exited chan struct{} // closed once the child was waited for
}

// echoElsewhere is a `bench echo` started by hand (--echo-at): nothing to stop.
type echoElsewhere struct{ prefix string }

func (e echoElsewhere) subject(tag string) string { return e.prefix + "." + tag }
func (e echoElsewhere) stop()                     {}

// startEchoProcess starts `bench echo` from this bench's own binary (cfg.exe in tests)
// and returns once it serves, or uses the one named by --echo-at.
func startEchoProcess(ctx context.Context, cfg Config, responders int) (echoResponders, error) {
	if cfg.EchoAt != "" {
		return echoElsewhere{prefix: cfg.EchoAt}, nil
	}
	exe := cfg.exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("echo process: find the bench binary: %w", err)
		}
	}
	p := &echoProcess{prefix: newEchoPrefix(), exited: make(chan struct{})}
	p.cmd = exec.Command(exe, echoChildArgs(cfg, p.prefix, responders)...)
	p.cmd.Env = echoChildEnv(cfg)
	p.cmd.Stderr = os.Stderr
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("echo process: %w", err)
	}
	p.stdin = stdin
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("echo process: %w", err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("echo process: %w", err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ready <- sc.Scan() && sc.Text() == "ready "+p.prefix
		_, _ = io.Copy(io.Discard, stdout) // until the child exits; then Wait may run
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	timeout := time.NewTimer(echoReadyWait)
	defer timeout.Stop()
	select {
	case ok := <-ready:
		if ok {
			return p, nil
		}
		err = errors.New("echo process: it exited or wrote something else than its ready line (its errors are above)")
	case <-timeout.C:
		err = fmt.Errorf("echo process: not serving within %v", echoReadyWait)
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.stop()
	return nil, err
}

func (p *echoProcess) subject(tag string) string { return p.prefix + "." + tag }

// stop closes the child's stdin, which ends it, and waits; after closeWait it kills it.
func (p *echoProcess) stop() {
	p.stdin.Close()
	select {
	case <-p.exited:
		return
	case <-time.After(closeWait):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// flagSet reports whether the command line gave flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
