package bus

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrUnauthenticatedListen is returned by StartEmbedded (and so by New) when the embedded
// server would listen on an address other hosts can reach and nothing authenticates
// clients: whoever reached the port could rewrite the segment store and the worker-ID
// leases and make IDs repeat. EmbeddedConfig.InsecureListen (--insecure-listen) insists.
var ErrUnauthenticatedListen = errors.New("the embedded NATS server would accept anyone on a non-loopback address")

// serverOptions are the embedded server's options: those of ConfigFile (a standard
// nats-server configuration file) when given, else the defaults. Listen, DataDir and
// Monitor always decide the client address, the JetStream store and the monitoring
// address, whatever the file says: notes says where they overrode it, for the log.
// JetStream is always on, and the dispenser owns the process's signals.
func (c EmbeddedConfig) serverOptions() (opts *server.Options, notes []string, err error) {
	opts = &server.Options{}
	if c.ConfigFile != "" {
		if opts, err = server.ProcessConfigFile(c.ConfigFile); err != nil {
			return nil, nil, fmt.Errorf("--nats-config %s: %w", c.ConfigFile, err)
		}
	}
	host, port, _ := SplitHostPort(c.Listen)
	if c.ConfigFile != "" && (opts.Host != "" || opts.Port != 0) && (opts.Host != host || opts.Port != port) {
		notes = append(notes, fmt.Sprintf("--listen %s wins over the client address %s of --nats-config", c.Listen, net.JoinHostPort(opts.Host, fmt.Sprint(opts.Port))))
	}
	opts.Host, opts.Port = host, port
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	if opts.StoreDir != "" && filepath.Clean(opts.StoreDir) != filepath.Clean(c.DataDir) {
		notes = append(notes, fmt.Sprintf("--data-dir %s wins over the JetStream store_dir %s of --nats-config", c.DataDir, opts.StoreDir))
	}
	opts.StoreDir = c.DataDir
	if c.ConfigFile != "" && !opts.JetStream {
		notes = append(notes, "--nats-config has no jetstream block: JetStream is on anyway (the dispenser keeps its state there)")
	}
	opts.JetStream = true
	if c.Monitor != "" {
		if opts.HTTPPort != 0 {
			notes = append(notes, fmt.Sprintf("--monitor %s wins over the monitoring address of --nats-config", c.Monitor))
		}
		opts.HTTPHost, opts.HTTPPort, _ = SplitHostPort(c.Monitor)
		opts.HTTPSPort = 0
	}
	if opts.ServerName == "" {
		opts.ServerName = c.Name
	}
	opts.NoSigs = true // the dispenser owns signals and shuts the server down itself
	ApplyLiveness(opts)
	return opts, notes, nil
}

// How soon a NATS server drops a connection whose other end has stopped (SIGSTOP, a VM
// pause, a hung host): a queue subscriber keeps its share of the requests until then.
// The server pings a silent connection every LivenessPingInterval and drops it once
// LivenessMaxPingsOut pings went unanswered, so a stalled dispenser is dropped 6 to 8 s
// after it stopped; a write to it blocked for LivenessWriteDeadline drops it too (at
// load, its socket buffers fill first). The price: a client whose link or process
// stalls that long (a slow link, a long GC pause) is dropped as well and reconnects.
// nats-server's defaults are 2 min, 2 and 10 s (a stalled dispenser kept for 6 to
// 8 min). deploy/nats.conf sets the same values (ping_interval, ping_max,
// write_deadline); docs/PROTOCOL.md ("Paused dispensers and the NATS server") says why.
const (
	LivenessPingInterval  = 2 * time.Second
	LivenessMaxPingsOut   = 2
	LivenessWriteDeadline = 2 * time.Second
)

// ApplyLiveness sets the liveness options that opts leaves unset (zero) to the values
// above: a configuration file (--nats-config) that sets them wins.
func ApplyLiveness(opts *server.Options) {
	if opts.PingInterval == 0 {
		opts.PingInterval = LivenessPingInterval
	}
	if opts.MaxPingsOut == 0 {
		opts.MaxPingsOut = LivenessMaxPingsOut
	}
	if opts.WriteDeadline == 0 {
		opts.WriteDeadline = LivenessWriteDeadline
	}
}

// checkExposure refuses a client listener that other hosts can reach when nothing
// authenticates clients, unless InsecureListen insists; then it returns the warning to
// log at start and every minute. The other listeners a configuration file may open
// (cluster, leaf nodes, websocket, MQTT) carry their own authorization blocks and are
// the file's business.
func (c EmbeddedConfig) checkExposure(opts *server.Options) (warning string, err error) {
	loopback := isLoopback
	if c.IsLoopback != nil {
		loopback = c.IsLoopback
	}
	if loopback(opts.Host) || clientAuthConfigured(opts) {
		return "", nil
	}
	if !c.InsecureListen {
		fix := "give --nats-config with a configuration that has users (deploy/nats-roles.conf has one per role)"
		if c.ConfigFile != "" {
			fix = fmt.Sprintf("add users (or a token, nkeys, TLS client verification) to %s (deploy/nats-roles.conf has one per role)", c.ConfigFile)
		}
		return "", fmt.Errorf("%w: --listen %s is reachable from other hosts and nothing authenticates clients, so anyone who reaches it could rewrite the segment store and worker-ID leases and make IDs repeat; "+
			"%s, or listen on 127.0.0.1, or add --insecure-listen to run it like this anyway",
			ErrUnauthenticatedListen, c.Listen, fix)
	}
	return fmt.Sprintf("INSECURE: the embedded NATS server listens on %s without authentication (--insecure-listen): anyone who reaches it can rewrite the segment store and worker-ID leases and make IDs repeat; give --nats-config with users", c.Listen), nil
}

// clientAuthConfigured reports whether the server checks who a client is: users or
// nkeys (with or without accounts), a single user or token, an operator (JWT), a custom
// authenticator or client certificates verified against a CA. A no_auth_user still
// lets clients without credentials in, but only with that user's permissions, which
// the configuration chose.
func clientAuthConfigured(o *server.Options) bool {
	return len(o.Users) > 0 || len(o.Nkeys) > 0 || o.Username != "" || o.Authorization != "" ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || o.CustomClientAuthentication != nil ||
		o.AuthCallout != nil || o.TLSVerify
}

// isLoopback reports whether host is only reachable from this machine: localhost or a
// loopback IP. Any other name, and the unspecified address (every interface), is not.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
