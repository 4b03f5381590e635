package dispenser

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
// is given: the one-binary default.
type EmbeddedConfig struct {
	Listen  string // client address, host:port; port 0 picks a free one
	DataDir string // JetStream keeps its streams (KV buckets, pools) under here
	Monitor string // host:port of the HTTP monitoring endpoint; "" keeps it off
	Name    string // server name (shows in monitoring and cluster views)
	Logger  *slog.Logger
}

// Validate checks the addresses and the data dir.
func (c EmbeddedConfig) Validate() error {
	if _, _, err := splitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	if c.Monitor != "" {
		if _, _, err := splitHostPort(c.Monitor); err != nil {
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
	srv *server.Server
}

// StartEmbedded starts the server and waits until it accepts clients.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, port, _ := splitHostPort(cfg.Listen)
	opts := &server.Options{
		ServerName: cfg.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		NoSigs:     true, // the dispenser owns signals and shuts the server down itself
	}
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	if cfg.Monitor != "" {
		opts.HTTPHost, opts.HTTPPort, _ = splitHostPort(cfg.Monitor)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configure embedded NATS server: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	srv.SetLoggerV2(&serverLogger{logger.With("component", "nats-server")}, false, false, false)
	go srv.Start() // Start returns once the listeners run; Shutdown stops everything it started
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server on %s not ready within 30s (is the port taken? is %s writable?)", cfg.Listen, cfg.DataDir)
	}
	return &Embedded{srv: srv}, nil
}

// ClientURL is the nats:// URL other processes use.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Addr is the address the server listens on (the port resolved when 0 was asked for).
func (e *Embedded) Addr() *net.TCPAddr { return e.srv.Addr().(*net.TCPAddr) }

// Connect opens an in-process connection (no TCP round trip for the dispenser itself).
func (e *Embedded) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(e.srv)}, opts...)
	return nats.Connect("", opts...)
}

// Shutdown stops the server and waits until it is gone; safe to call twice.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

func splitHostPort(hostport string) (string, int, error) {
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

// serverLogger sends nats-server's log lines to slog.
type serverLogger struct{ l *slog.Logger }

func (s *serverLogger) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Fatalf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Errorf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Debugf(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s *serverLogger) Tracef(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
