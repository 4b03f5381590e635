package dispenser

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/boundedfile"
)

// Credentials are one NATS user's credentials: at most one of User/Password, Token,
// NKeySeedFile and CredsFile. The zero value means "none given".
//
// A dispenser has two connections: one for JetStream (segment store, worker-ID leases,
// clock records, pools, leaf.time), authenticated by Config.Conn, and one for the service
// (it answers requests), authenticated by Config.ServiceAuth when that is given and by
// Config.Conn otherwise. Giving the service a user of its own lets NATS permissions keep
// the connection that answers callers, with whatever reply subject they chose, away
// from JetStream (deploy/nats-roles.conf: users dispenser and dispenser-service).
type Credentials struct {
	User         string
	Password     string
	Token        string
	NKeySeedFile string // a file holding an NKey user seed (SU...)
	CredsFile    string // a .creds file (JWT and seed)
}

// given reports whether any credential is set.
func (c Credentials) given() bool { return c != Credentials{} }

// methods names the authentication methods set, as the flags spell them with prefix
// ("--" or "--service-").
func (c Credentials) methods(prefix string) []string {
	var m []string
	if c.User != "" || c.Password != "" {
		m = append(m, prefix+"user")
	}
	if c.Token != "" {
		m = append(m, prefix+"token")
	}
	if c.NKeySeedFile != "" {
		m = append(m, prefix+"nkey")
	}
	if c.CredsFile != "" {
		m = append(m, prefix+"creds")
	}
	return m
}

// validate reports a password without a user, more than one method and missing files,
// naming the flags with prefix.
func (c Credentials) validate(prefix string) []error {
	var errs []error
	if c.Password != "" && c.User == "" {
		errs = append(errs, fmt.Errorf("%spassword given without %suser", prefix, prefix))
	}
	if m := c.methods(prefix); len(m) > 1 {
		errs = append(errs, fmt.Errorf("choose one NATS authentication method for %s, got %s", connName(prefix), strings.Join(m, " and ")))
	}
	// A file that holds no seed fails now, naming it, not at every connect until
	// --start-timeout.
	if err := client.CheckNKeyFile(prefix+"nkey", c.NKeySeedFile); err != nil {
		errs = append(errs, err)
	}
	if err := client.CheckCredsFile(prefix+"creds", c.CredsFile); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// connName names the connections the flags with prefix authenticate.
func connName(prefix string) string {
	if prefix == "--service-" {
		return "the service connection"
	}
	return "the dispenser's connections"
}

// apply returns conn with c's credentials in place of conn's own (servers, TLS and name
// stay conn's).
func (c Credentials) apply(conn client.ConnConfig) client.ConnConfig {
	conn.User, conn.Password, conn.Token = c.User, c.Password, c.Token
	conn.NKeySeedFile, conn.CredsFile = c.NKeySeedFile, c.CredsFile
	return conn
}

// credentials are Conn's credentials.
func (c Config) credentials() Credentials {
	return Credentials{
		User: c.Conn.User, Password: c.Conn.Password, Token: c.Conn.Token,
		NKeySeedFile: c.Conn.NKeySeedFile, CredsFile: c.Conn.CredsFile,
	}
}

// checkAuth checks --nats-config and the credentials of both connections. Credentials
// without --nats are for the embedded server, which has users only with --nats-config.
func (c Config) checkAuth() []error {
	var errs []error
	if c.NATSConfig != "" {
		// Read by the embedded server's parser: a named pipe or a device is refused
		// here, within the bounds of every file the dispenser is given.
		if _, err := boundedfile.Read("--nats-config", c.NATSConfig, 4<<20); err != nil {
			errs = append(errs, err)
		}
		if c.NATS == "" {
			// With --nats, checkNATS validates Conn; embedded, this does.
			errs = append(errs, c.credentials().validate("--")...)
		}
	}
	errs = append(errs, c.ServiceAuth.validate("--service-")...)
	if c.ServiceAuth.given() && c.NATS == "" && c.NATSConfig == "" {
		errs = append(errs, fmt.Errorf("%s: the embedded server has users only with --nats-config (or give --nats)",
			strings.Join(c.ServiceAuth.methods("--service-"), ", ")))
	}
	return errs
}

// connectAs opens the connection named name with creds in place of the
// --user/--creds/... credentials when creds are given, and with extra options after the
// configured ones (bus.Connect): to --nats, or in process to the embedded server.
func (d *Dispenser) connectAs(name string, creds Credentials, extra ...nats.Option) (*nats.Conn, error) {
	conn := d.cfg.connConfig(name)
	if creds.given() {
		conn = creds.apply(conn)
	}
	nc, err := bus.Connect(conn, d.embedded, d.log, extra...)
	if err != nil && d.embedded != nil {
		return nil, fmt.Errorf("%w (as %s)", err, d.describeCreds(creds))
	}
	return nc, err
}

// describeCreds names who a connection authenticates as, for messages.
func (d *Dispenser) describeCreds(creds Credentials) string {
	if !creds.given() {
		creds = d.cfg.credentials()
	}
	switch {
	case creds.User != "":
		return fmt.Sprintf("user %q", creds.User)
	case creds.Token != "":
		return "a token"
	case creds.NKeySeedFile != "":
		return fmt.Sprintf("the NKey in %s", creds.NKeySeedFile)
	case creds.CredsFile != "":
		return fmt.Sprintf("the credentials in %s", creds.CredsFile)
	}
	return "no user"
}

// ErrServiceRefused is returned by New when the NATS server refuses the service
// connection's subscriptions: its user may not serve (with per-role permissions, it is
// the JetStream user, as when no --service-* credentials are given).
var ErrServiceRefused = errors.New("the NATS server refuses the service's subscriptions")

// checkServicePermissions fails the start when the server refused any of the service's
// subscriptions: a refused subscription is reported asynchronously, so without this the
// dispenser would run and every request would answer "no responders". bus.New's
// round trip has brought the refusal in by now.
func (d *Dispenser) checkServicePermissions(nc *nats.Conn) error {
	err := nc.LastError()
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	who := d.describeCreds(d.cfg.ServiceAuth)
	if !d.cfg.ServiceAuth.given() {
		return fmt.Errorf("%w: the service connection authenticates as %s (no --service-* credentials given, so the JetStream connection's): %v; "+
			"give the service a user of its own that may subscribe in queue group %q (deploy/nats-roles.conf: dispenser-service) with --service-user/--service-password, --service-creds, --service-nkey or --service-token",
			ErrServiceRefused, who, err, d.cfg.Prefix)
	}
	return fmt.Errorf("%w: the service connection authenticates as %s: %v; that user must be allowed to subscribe to the service's subjects in queue group %q and to $SRV.>",
		ErrServiceRefused, who, err, d.cfg.Prefix)
}
