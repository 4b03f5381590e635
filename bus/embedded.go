package bus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// EmbeddedConfig configures the NATS server a dispenser runs in process when no --nats
// is given: the one-binary default. The server is part of the NATS face: it is what the
// service, and everything else of the dispenser, connects to in process.
type EmbeddedConfig struct {
	Listen  string // client address, host:port; port 0 picks a free one
	DataDir string // JetStream keeps its streams (KV buckets, pools) under here
	Monitor string // host:port of the HTTP monitoring endpoint; "" keeps it off
	Name    string // server name (shows in monitoring and cluster views) unless ConfigFile names it
	Logger  *slog.Logger

	// ConfigFile is a nats-server configuration file (--nats-config): accounts, users,
	// permissions, TLS, clustering. Listen, DataDir and Monitor still decide the client
	// address, the JetStream store and the monitoring address (embedded_config.go).
	ConfigFile string
	// InsecureListen lets the server listen on a non-loopback address when nothing
	// authenticates clients (--insecure-listen); without it StartEmbedded refuses with
	// ErrUnauthenticatedListen.
	InsecureListen bool

	// IsLoopback decides which listen hosts count as loopback; nil: the real check. Tests
	// set it to play an exposed server on 127.0.0.1.
	IsLoopback func(host string) bool
}

// Validate checks the addresses and the data dir.
func (c EmbeddedConfig) Validate() error {
	if _, _, err := SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	if c.Monitor != "" {
		if _, _, err := SplitHostPort(c.Monitor); err != nil {
			return fmt.Errorf("monitor address %q: %w", c.Monitor, err)
		}
	}
	if c.DataDir == "" {
		return errors.New("--data-dir is empty: JetStream needs a directory")
	}
	return nil
}

// Embedded is a running in-process NATS server with JetStream.
type Embedded struct {
	srv      *server.Server
	insecure string // the warning to repeat while it runs exposed without authentication; "" if not
}

// StartEmbedded starts the server and waits until it accepts clients.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts, notes, err := cfg.serverOptions()
	if err != nil {
		return nil, err
	}
	insecure, err := cfg.checkExposure(opts)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	for _, n := range notes {
		logger.Info(n)
	}
	if insecure != "" {
		logger.Warn(insecure)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configure embedded NATS server: %w", err)
	}
	sl := &serverLogger{l: logger.With("component", "nats-server"), fatal: make(chan string, 1)}
	srv.SetLoggerV2(sl, false, false, false)
	go srv.Start() // Start returns once the listeners run; Shutdown stops everything it started
	if err := waitReady(srv, sl.fatal, 30*time.Second); err != nil {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server on %s: %w (is the port taken? is %s writable?)", cfg.Listen, err, cfg.DataDir)
	}
	return &Embedded{srv: srv, insecure: insecure}, nil
}

// ClientURL is the nats:// URL other processes use.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Addr is the address the server listens on (the port resolved when 0 was asked for).
func (e *Embedded) Addr() *net.TCPAddr { return e.srv.Addr().(*net.TCPAddr) }

// Varz is the server's monitoring snapshot, what its /varz endpoint serves.
func (e *Embedded) Varz() (*server.Varz, error) { return e.srv.Varz(nil) }

// Connz is the server's connections, what its /connz endpoint serves.
func (e *Embedded) Connz(opts *server.ConnzOptions) (*server.Connz, error) { return e.srv.Connz(opts) }

// Connect opens an in-process connection (no TCP round trip for the dispenser itself).
func (e *Embedded) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(inProcessServer{e.srv})}, opts...)
	return nats.Connect("", opts...)
}

// InProcess is the option that connects a nats.go connection to this server in process,
// whatever URL it is given (the URL still names the server for TLS).
func (e *Embedded) InProcess() nats.Option {
	return nats.InProcessServer(inProcessServer{e.srv})
}

// Insecure is the warning to repeat while the server runs exposed without authentication
// (--insecure-listen), "" when it does not.
func (e *Embedded) Insecure() string { return e.insecure }

// Shutdown stops the server and waits until it is gone; safe to call twice.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// SplitHostPort reads an address as the dispenser's flags take it (--listen, --monitor,
// --http): a host, which must be given, and a port from 0 to 65535.
func SplitHostPort(hostport string) (string, int, error) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a number from 0 to 65535", p)
	}
	if host == "" {
		return "", 0, errors.New("no host: give an address such as 127.0.0.1, or 0.0.0.0 for every interface")
	}
	return host, port, nil
}

// serverLogger sends nats-server's log lines to slog, and its first fatal one to fatal
// (embedded_ready.go).
type serverLogger struct {
	l     *slog.Logger
	fatal chan string // capacity 1
}

func (s *serverLogger) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Fatalf(format string, v ...any)  { s.fatalf(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Errorf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Debugf(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Tracef(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
