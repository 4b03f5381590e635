package dispenser

import (
	"fmt"
	"strings"
)

// checkModes refuses settings that the chosen mode would ignore: a flag that is given and
// silently does nothing is worse than an error (issue 16: --user/--password with the
// embedded server, which has no users, let every client in). Each message says why the
// flag does not apply and what to use instead. Only settings whose zero value means "not
// given" can be checked here; cmd/dispenser checks the flags with other defaults
// (--listen, --zk-name, --lease-ttl, --sample-tag) by whether they were given.
func (c Config) checkModes() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.NATS == "" && c.NATSConfig == "" {
		if creds := c.connCredentialFlags(); len(creds) > 0 {
			add("%s: the embedded NATS server has no users without --nats-config: give --nats-config defining users, or --nats (docs/errors.md#embedded-users)",
				strings.Join(creds, ", "))
		}
		if tls := c.connTLSFlags(); len(tls) > 0 {
			add("%s: the embedded NATS server speaks TLS only when --nats-config configures it (a tls block), so the flags would be ignored; give --nats-config, or --nats to join NATS servers that use TLS",
				strings.Join(tls, ", "))
		}
	}
	if c.NATS != "" {
		for _, f := range []struct {
			flag  string
			given bool
		}{{"--nats-config", c.NATSConfig != ""}, {"--insecure-listen", c.InsecureListen}, {"--monitor", c.Monitor != ""}} {
			if f.given {
				add("%s configures the embedded NATS server, and with --nats %s the dispenser embeds none: drop %s, or configure those NATS servers instead", f.flag, c.NATS, f.flag)
			}
		}
	}
	if !c.usesMySQL() {
		if c.MySQLDSN != "" {
			add("--mysql-dsn is only used with --segment-store mysql or --worker-registry mysql (got %s and %s)", c.SegmentStore, c.WorkerRegistry)
		}
		if c.MySQLCreateTable {
			add("--mysql-create-table is only used with --segment-store mysql or --worker-registry mysql (got %s and %s)", c.SegmentStore, c.WorkerRegistry)
		}
	}
	if c.ZK != "" && c.WorkerRegistry != "zk" {
		add("--zk is only used with --worker-registry zk (got %s)", c.WorkerRegistry)
	}
	if c.Advertise != "" && c.WorkerRegistry != "zk" && c.WorkerRegistry != "mysql" {
		add("--advertise is only used with --worker-registry zk or mysql (got %s)", c.WorkerRegistry)
	}
	return errs
}

// connCredentialFlags names the credential flags of Conn that are set.
func (c Config) connCredentialFlags() []string {
	var flags []string
	for _, f := range []struct {
		flag, value string
	}{{"--user", c.Conn.User}, {"--password", c.Conn.Password}, {"--token", c.Conn.Token}, {"--nkey", c.Conn.NKeySeedFile}, {"--creds", c.Conn.CredsFile}} {
		if f.value != "" {
			flags = append(flags, f.flag)
		}
	}
	return flags
}

// connTLSFlags names the TLS flags of Conn that are set.
func (c Config) connTLSFlags() []string {
	var flags []string
	for _, f := range []struct {
		flag, value string
	}{{"--tls-ca", c.Conn.TLSCA}, {"--tls-cert", c.Conn.TLSCert}, {"--tls-key", c.Conn.TLSKey}} {
		if f.value != "" {
			flags = append(flags, f.flag)
		}
	}
	return flags
}
