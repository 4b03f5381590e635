package main

import (
	"flag"

	"github.com/leafbus/leafbus/dispenser"
)

// registerSecurityFlags adds the embedded server's security flags and the service
// connection's own credentials to fs. The --service-* flags authenticate only the
// connection that answers requests; without them it uses --user/--creds/... like the
// JetStream connection (docs/operations.md "Who may do what on NATS").
func (c *Config) registerSecurityFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NATSConfig, "nats-config", c.NATSConfig, "nats-server configuration file for the embedded server (accounts, users, permissions, TLS); --listen, --data-dir and --monitor still decide its addresses and store")
	fs.BoolVar(&c.InsecureListen, "insecure-listen", c.InsecureListen, "let the embedded server listen on a non-loopback address without authentication (refused otherwise; warned about every minute)")
	registerServiceAuth(fs, &c.ServiceAuth)
}

func registerServiceAuth(fs *flag.FlagSet, a *dispenser.Credentials) {
	fs.StringVar(&a.User, "service-user", a.User, "NATS user of the service connection only (with --service-password); default: --user's")
	fs.StringVar(&a.Password, "service-password", a.Password, "NATS password of --service-user")
	fs.StringVar(&a.Token, "service-token", a.Token, "NATS token of the service connection only")
	fs.StringVar(&a.NKeySeedFile, "service-nkey", a.NKeySeedFile, "file holding the NKey user seed of the service connection only")
	fs.StringVar(&a.CredsFile, "service-creds", a.CredsFile, "NATS .creds file of the service connection only")
}
