package main

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/nats-io/nats.go"
)

// closeWait bounds how long closing a connection waits for nats.go's callbacks to end.
const closeWait = 5 * time.Second

// benchConn is one client of the bench: a NATS connection (a load client or an echo
// responder), or with --http a load client of Leaf's HTTP API (web, and no nc).
type benchConn struct {
	nc     *nats.Conn
	web    *httpClient
	slow   atomic.Int64  // slow-consumer events: replies nats.go dropped (they become timeouts)
	closed chan struct{} // closed by nats.go's last callback, once the connection is gone
}

// connect opens a connection with the deployment's credentials and TLS settings
// (client.ConnConfig, as the dispenser uses them) under the given connection name, its
// reply inboxes under inboxPrefix ("" for nats.go's _INBOX).
func connect(cfg client.ConnConfig, inboxPrefix, name string, logger *slog.Logger) (*benchConn, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.Name = name
	opts, err := cfg.Options(logger)
	if err != nil {
		return nil, err
	}
	if inboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(inboxPrefix))
	}
	cl := &benchConn{closed: make(chan struct{})}
	opts = append(opts,
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				cl.slow.Add(1) // shown in the report, not a log line per drop
				return
			}
			logger.Error("NATS asynchronous error", "connection", name, "err", err)
		}),
		// A bench closes its connections on purpose: only a real disconnect is worth a warning.
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				logger.Warn("NATS disconnected", "connection", name, "server", nc.ConnectedUrlRedacted(), "err", err)
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(cl.closed) }),
	)
	nc, err := nats.Connect(cfg.URLs, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", client.RedactURLs(cfg.URLs), err)
	}
	cl.nc = nc
	return cl, nil
}

// connectClients opens one connection per load client. It returns the ones it opened
// even on error, for the caller to close.
func connectClients(cfg Config, logger *slog.Logger) ([]*benchConn, error) {
	if cfg.HTTP != "" {
		return httpClients(cfg), nil
	}
	var clients []*benchConn
	for i := range cfg.Clients {
		cl, err := connect(cfg.Conn, cfg.InboxPrefix, fmt.Sprintf("leafbus-bench-%d", i), logger)
		if err != nil {
			return clients, fmt.Errorf("client %d: %w", i, err)
		}
		clients = append(clients, cl)
	}
	return clients, nil
}

// closeClients closes the connections and waits until nats.go has run their last
// callbacks (an HTTP client, until its requests in flight ended), so nothing of theirs
// outlives the run.
func closeClients(clients []*benchConn) {
	for _, cl := range clients {
		if cl.web != nil {
			cl.web.close(cl.closed)
			continue
		}
		cl.nc.Close()
	}
	timeout := time.NewTimer(closeWait)
	defer timeout.Stop()
	for _, cl := range clients {
		select {
		case <-cl.closed:
		case <-timeout.C:
			return
		}
	}
}
