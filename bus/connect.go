package bus

import (
	"fmt"
	"log/slog"
	"net/url"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
)

// Connect opens a dispenser's connection as conn describes it (servers, credentials, TLS,
// name), with extra options after those: to conn.URLs, or, when e is the embedded server
// of the one-binary default, in process to it. An in-process connection authenticates
// (and, with the TLS settings, presents its certificate) exactly as a TCP client does
// when the server's configuration has users; the URL only names the server, whose
// certificate TLS checks against that host.
func Connect(conn client.ConnConfig, e *Embedded, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	if e == nil {
		opts, err := conn.Options(log)
		if err != nil {
			return nil, err
		}
		nc, err := nats.Connect(conn.URLs, append(opts, extra...)...)
		if err != nil {
			return nil, fmt.Errorf("connect to NATS at %s: %w", client.RedactURLs(conn.URLs), err)
		}
		return nc, nil
	}
	// The bytes go through a pipe. The scheme stays nats://: the TLS settings, not a
	// tls:// scheme, decide whether this client speaks TLS in process.
	u, err := url.Parse(e.ClientURL())
	if err != nil {
		return nil, fmt.Errorf("embedded server URL: %w", err)
	}
	u.Scheme = "nats"
	conn.URLs = u.String()
	opts, err := conn.Options(log)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(conn.URLs, append(append(opts, extra...), e.InProcess())...)
	if err != nil {
		return nil, fmt.Errorf("connect in process to the embedded NATS server: %w", err)
	}
	return nc, nil
}
