package client

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/boundedfile"
)

// ConnConfig says how to reach an existing NATS deployment: the servers and the
// credentials, as operators give them to `dispenser --nats`, the `dispenser tag` commands
// and `bench`. At most one of User/Password, Token, NKeySeedFile and CredsFile is set.
type ConnConfig struct {
	URLs         string // comma separated, e.g. nats://10.0.0.1:4222,nats://10.0.0.2:4222
	User         string
	Password     string
	Token        string
	NKeySeedFile string // a file holding an NKey user seed (SU...)
	CredsFile    string // a .creds file (JWT and seed), as `nsc` writes them
	TLSCA        string // CA bundle to verify the servers; enables TLS
	TLSCert      string // client certificate (mutual TLS), with TLSKey
	TLSKey       string
	Name         string // connection name shown by the servers' monitoring
}

// RegisterFlags adds the credential and TLS flags (not the URL flag, whose name and
// default differ per command) to fs.
func (c *ConnConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.User, "user", c.User, "NATS user name (with --password)")
	fs.StringVar(&c.Password, "password", c.Password, "NATS password")
	fs.StringVar(&c.Token, "token", c.Token, "NATS authentication token")
	fs.StringVar(&c.NKeySeedFile, "nkey", c.NKeySeedFile, "file holding a NATS NKey user seed")
	fs.StringVar(&c.CredsFile, "creds", c.CredsFile, "NATS .creds file (JWT and seed)")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "CA certificates (PEM) that verify the NATS servers; turns TLS on")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "client certificate (PEM) for mutual TLS, with --tls-key")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "client private key (PEM) for --tls-cert")
}

// Validate reports contradictory or incomplete settings, naming the flags involved.
func (c ConnConfig) Validate() error {
	if strings.TrimSpace(c.URLs) == "" {
		return errors.New("no NATS server URL given")
	}
	if err := checkURLs(c.URLs); err != nil {
		return err
	}
	var methods []string
	if c.User != "" || c.Password != "" {
		if c.User == "" {
			return errors.New("--password given without --user")
		}
		methods = append(methods, "--user")
	}
	if c.Token != "" {
		methods = append(methods, "--token")
	}
	if c.NKeySeedFile != "" {
		methods = append(methods, "--nkey")
	}
	if c.CredsFile != "" {
		methods = append(methods, "--creds")
	}
	if len(methods) > 1 {
		return fmt.Errorf("choose one NATS authentication method, got %s", strings.Join(methods, " and "))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("--tls-cert %q and --tls-key %q go together", c.TLSCert, c.TLSKey)
	}
	// A missing file is found now, naming its flag, not at the first connect; so is a
	// seed or .creds file that holds none, which the server would refuse at every try.
	if err := CheckNKeyFile("--nkey", c.NKeySeedFile); err != nil {
		return err
	}
	if err := CheckCredsFile("--creds", c.CredsFile); err != nil {
		return err
	}
	// nats.go reads the TLS files at connect: a named pipe or /dev/zero is refused
	// here, by the same bounds.
	for _, f := range []struct{ flag, path string }{
		{"--tls-ca", c.TLSCA}, {"--tls-cert", c.TLSCert}, {"--tls-key", c.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		data, err := boundedfile.Read(f.flag, f.path, maxTLSFileBytes)
		if err != nil {
			return err
		}
		clear(data) // a private key

	}
	return nil
}

// maxTLSFileBytes bounds a PEM file of certificates (a CA bundle is some 200 KB).
const maxTLSFileBytes = 4 << 20

// maxAuthFileBytes bounds an NKey seed or .creds file: a few hundred bytes in use.
const maxAuthFileBytes = 64 << 10

// CheckNKeyFile checks that the file at path ("" passes) holds an NKey user seed
// (SU...), as --nkey (flag, named in the error with path) takes it. The errors never
// quote the file.
func CheckNKeyFile(flag, path string) error {
	return checkAuthFile(flag, path, func(data []byte) error {
		if err := userSeed(data); err != nil {
			return fmt.Errorf("no NKey user seed (SU...) in it (`nk -gen user` makes one): %w", err)
		}
		return nil
	})
}

// CheckCredsFile checks that the file at path ("" passes) is a .creds file: a user JWT
// and the user's NKey seed, as `nsc` writes them. The errors never quote the file.
func CheckCredsFile(flag, path string) error {
	return checkAuthFile(flag, path, func(data []byte) error {
		const want = "want a user JWT and its NKey seed, as `nsc generate creds` writes them"
		text, err := nkeys.ParseDecoratedJWT(data)
		if err == nil {
			_, err = jwt.DecodeUserClaims(text)
		}
		if err != nil { // jwt's errors may quote what it read: not shown
			return fmt.Errorf("not a .creds file (no user JWT in it): %s", want)
		}
		if err := userSeed(data); err != nil {
			return fmt.Errorf("not a .creds file (%v): %s", err, want)
		}
		return nil
	})
}

// checkAuthFile reads the file at path ("" passes) within bounds and checks it, the
// errors naming flag and path; the bytes are cleared after.
func checkAuthFile(flag, path string, check func(data []byte) error) error {
	if path == "" {
		return nil
	}
	data, err := boundedfile.Read(flag, path, maxAuthFileBytes)
	if err != nil {
		return err
	}
	defer clear(data)
	if err := check(data); err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return nil
}

// userSeed checks that data holds an NKey user seed (nkeys' errors never quote it).
func userSeed(data []byte) error {
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return err
	}
	kp.Wipe()
	return nil
}

// reconnectPolicy is the wait between reconnect attempts: 250 to 375 ms after the
// first failure, doubling, 5 to 7.5 s at most: quick after a blip, gentle during an
// outage. (A ceiling of 375 ms with a third of it random is 250 ms plus up to half
// again.)
var reconnectPolicy = backoff.Policy{Min: 375 * time.Millisecond, Max: 7500 * time.Millisecond, Jitter: 1.0 / 3}

// everyMinute lets a log line through at most once a minute, counting the others.
type everyMinute struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// due reports whether a line is due at now, and how many were held back since the last.
func (e *everyMinute) due(now time.Time) (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.last.IsZero() && now.Sub(e.last) < time.Minute {
		e.suppressed++
		return 0, false
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return n, true
}

// Options turns the configuration into nats.go options. The connection retries forever
// with back-off and jitter, and logs every state change, because a dispenser must outlive
// a NATS server restart or the loss of a cluster node.
func (c ConnConfig) Options(logger *slog.Logger) ([]nats.Option, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var slow everyMinute // slow consumer errors
	// The server last connected to, for the disconnect line: once the connection is
	// down, nats.go no longer says which server it was.
	var server atomic.Pointer[string]
	noteServer := func(nc *nats.Conn) {
		u := nc.ConnectedUrlRedacted()
		server.Store(&u)
	}
	lastServer := func() string {
		if u := server.Load(); u != nil {
			return *u
		}
		return ""
	}
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(false),
		// Reconnect forever means also after a server refused the credentials (they
		// may be fixed on the server); nats.go gives up after two refusals otherwise.
		nats.IgnoreAuthErrorAbort(),
		// With a custom delay nats.go ignores ReconnectWait and ReconnectJitter: the
		// jitter is in the policy, so that dispensers do not all retry in step after a
		// restart.
		nats.CustomReconnectDelay(reconnectPolicy.Delay),
		nats.ConnectHandler(noteServer),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil { // nil: a deliberate Close, not news
				logger.Warn("NATS disconnected", "server", lastServer(), "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			noteServer(nc)
			logger.Info("NATS reconnected", "server", lastServer())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			logger.Info("NATS connection closed")
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			if errors.Is(err, nats.ErrSlowConsumer) {
				// Anyone who may answer a request can flood its inbox: at most a
				// line a minute, saying how many more there were.
				if n, ok := slow.due(time.Now()); ok {
					logger.Error("NATS asynchronous error", "subject", subject, "err", err, "more_since_last_line", n)
				}
				return
			}
			logger.Error("NATS asynchronous error", "subject", subject, "err", err)
		}),
	}
	switch {
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	case c.Token != "":
		opts = append(opts, nats.Token(c.Token))
	case c.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("read NKey seed %q: %w", c.NKeySeedFile, err)
		}
		opts = append(opts, o)
	case c.CredsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts, nil
}

// Connect connects to c.URLs with c's options.
func (c ConnConfig) Connect(logger *slog.Logger) (*nats.Conn, error) {
	opts, err := c.Options(logger)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(c.URLs, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", RedactURLs(c.URLs), err)
	}
	return nc, nil
}

// RedactURLs is urls (comma separated) without their user information, for errors,
// logs and reports: a URL such as nats://app:secret@host:4222 or nats://token@host
// carries a credential. Everything before the last "@" (after the scheme's "://") is
// cut, without parsing: a URL that does not parse (a password with "%zz" or "#" in it)
// or has no scheme ("app:secret@host:4222", which nats.go takes) still loses it, and so
// does a password with a comma in it (splitURLs).
func RedactURLs(urls string) string {
	var out []string
	for _, s := range splitURLs(urls) {
		scheme, rest := "", s
		if i := strings.Index(s, "://"); i >= 0 {
			scheme, rest = s[:i+3], s[i+3:]
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = rest[at+1:]
		}
		out = append(out, scheme+rest)
	}
	return strings.Join(out, ",")
}

// splitURLs splits a comma-separated list of URLs as nats.go does, except that a piece
// without "@" followed by pieces up to one with "@" (none of them starting a URL of its
// own with "://") is one URL whose user information holds commas: "nats://bob:a,b@host"
// is one URL, which nats.go would split into "nats://bob:a" and "b@host".
func splitURLs(urls string) []string {
	var pieces []string
	for _, s := range strings.Split(urls, ",") {
		if s = strings.TrimSpace(s); s != "" {
			pieces = append(pieces, s)
		}
	}
	var out []string
	for i := 0; i < len(pieces); i++ {
		u := pieces[i]
		if !strings.Contains(u, "@") {
			for j := i + 1; j < len(pieces) && !strings.Contains(pieces[j], "://"); j++ {
				if strings.Contains(pieces[j], "@") {
					u, i = strings.Join(pieces[i:j+1], ","), j
					break
				}
			}
		}
		out = append(out, u)
	}
	return out
}

// checkURLs refuses a server URL that nats.go would not read as its author meant:
// one that does not parse, or whose password or token went into the host, path, query
// or fragment (a "/", "?", "#", "%", a space or a comma not percent-encoded). nats.go's
// own errors quote the URL, password and all; these name it without its user
// information.
func checkURLs(urls string) error {
	const fix = "percent-encode the user information (%% as %%25, @ %%40, / %%2F, : %%3A, ? %%3F, # %%23, , %%2C, space %%20) or give the credentials with --user/--password or --token"
	for n, raw := range splitURLs(urls) {
		bad := ""
		if strings.Contains(raw, ",") {
			// "nats://bob:pa,ss@host", or "nats://h0,tok@h1" (which may be a token
			// with a comma): nats.go reads two URLs, and could show a piece of the
			// password as a host. Refused; written "nats://tok@h1" it is not.
			bad = "its user information holds a comma, which separates URLs (or a URL after it has user information but no nats://)"
		}
		for piece := range strings.SplitSeq(raw, ",") {
			if bad != "" {
				break
			}
			u := strings.TrimSpace(piece)
			if !strings.Contains(u, "://") {
				u = "nats://" + u // as nats.go reads it
			}
			parsed, err := url.Parse(u)
			switch {
			case err != nil:
				bad = "it does not parse as a URL" // err quotes the URL: not shown
			case parsed.Opaque != "" || parsed.Fragment != "" || parsed.RawQuery != "" || parsed.ForceQuery ||
				(parsed.Path != "" && parsed.Path != "/" && !strings.HasPrefix(parsed.Scheme, "ws")):
				bad = "part of it is read as a path, query or fragment"
			case parsed.Host == "":
				bad = "it names no host"
			}
		}
		if bad != "" {
			return fmt.Errorf("NATS server URL %d (%s, user information not shown): %s: "+fix, n+1, RedactURLs(raw), bad)
		}
	}
	return nil
}
