package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
	"github.com/nats-io/nats.go"
)

// clientFlags are what the subcommands that talk to a running deployment share:
// where it is, how to authenticate, its prefix, and the reply inboxes' prefix.
type clientFlags struct {
	conn        client.ConnConfig
	prefix      string
	inboxPrefix string // "" is nats.go's _INBOX
	timeout     time.Duration
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	c.conn.URLs = "nats://127.0.0.1:4222"
	c.prefix = "leaf"
	c.timeout = 10 * time.Second
	fs.StringVar(&c.conn.URLs, "nats", c.conn.URLs, "comma-separated NATS server URLs of the deployment")
	c.conn.RegisterFlags(fs)
	fs.StringVar(&c.prefix, "prefix", c.prefix, "subject prefix of the deployment")
	fs.StringVar(&c.inboxPrefix, "inbox-prefix", "", "subject prefix of the reply inboxes instead of _INBOX, for a NATS user that may only subscribe to its own (deploy/nats-roles.conf: _INBOX_<user>)")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "how long to wait for an answer")
}

// checkInboxPrefix refuses an inbox prefix that is no plain subject, or one the
// dispenser never answers on (PROTOCOL.md "Reply subjects"): every request would time
// out.
func (c *clientFlags) checkInboxPrefix() error {
	if c.inboxPrefix == "" {
		return nil
	}
	for tok := range strings.SplitSeq(c.inboxPrefix, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("--inbox-prefix %q is not a subject of plain tokens", c.inboxPrefix)
		}
	}
	if !(wire.Subjects{Prefix: c.prefix}).ReplyAllowed(c.inboxPrefix + ".x") {
		return fmt.Errorf("--inbox-prefix %q: the dispenser never answers on it (PROTOCOL.md \"Reply subjects\")", c.inboxPrefix)
	}
	return nil
}

// parseSubcommand parses a subcommand's flags and environment (LEAFBUS_<NAME>, as for
// serving), returning usage errors for exit code 2.
func parseSubcommand(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if err := applyEnv(fs, getenv); err != nil {
		return &usageError{err}
	}
	return nil
}

// connect opens the connection and a client on it; close the connection when done.
func (c *clientFlags) connect() (*nats.Conn, *client.Client, error) {
	if err := wire.CheckPrefix(c.prefix); err != nil {
		return nil, nil, &usageError{err}
	}
	if err := c.checkInboxPrefix(); err != nil {
		return nil, nil, &usageError{err}
	}
	c.conn.Name = "leafbus dispenser cli"
	opts, err := c.conn.Options(nil)
	if err != nil {
		return nil, nil, &usageError{err}
	}
	// A command line tool should fail fast, not reconnect forever.
	opts = append(opts, nats.MaxReconnects(0), nats.Timeout(c.timeout))
	if c.inboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.inboxPrefix))
	}
	nc, err := nats.Connect(c.conn.URLs, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", client.RedactURLs(c.conn.URLs), err)
	}
	if err := c.checkInbox(nc); err != nil {
		nc.Close()
		return nil, nil, err
	}
	cl, err := client.NewClient(nc, client.WithPrefix(c.prefix), client.WithTimeout(c.timeout))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, cl, nil
}

// checkInbox subscribes to an inbox of the connection's prefix and makes sure the
// server took it: a user confined to inboxes of its own prefix (deploy/nats-roles.conf's
// applications) is refused _INBOX, and every request would then wait out --timeout
// for an answer that cannot arrive. Said at once instead, with the fix.
func (c *clientFlags) checkInbox(nc *nats.Conn) error {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("subscribe to a reply inbox: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // a probe; the connection closes soon
	if err := nc.FlushTimeout(c.timeout); err != nil {
		return fmt.Errorf("NATS at %s: %w", client.RedactURLs(c.conn.URLs), err)
	}
	err = nc.LastError()
	if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), inbox) {
		return nil
	}
	prefix := c.inboxPrefix
	if prefix == "" {
		prefix = strings.TrimSuffix(nats.InboxPrefix, ".")
	}
	return fmt.Errorf("the NATS server refuses this user its reply inboxes %s.> (%w): give its own prefix in --inbox-prefix (docs/errors.md#inbox-prefix)", prefix, err)
}

// namesUser puts in front of a permissions violation the NATS user it was for, and
// which user of deploy/nats-roles.conf may do it (roles): the server's message names the
// subject only. Other errors are returned as they are.
func (c *clientFlags) namesUser(err error, roles string) error {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return err
	}
	who := "the connection's NATS user"
	switch {
	case c.conn.User != "":
		who = fmt.Sprintf("user %q", c.conn.User)
	case c.conn.CredsFile != "":
		who = "the user of --creds " + c.conn.CredsFile
	case c.conn.NKeySeedFile != "":
		who = "the user of --nkey " + c.conn.NKeySeedFile
	}
	return fmt.Errorf("the NATS server denies %s this (deploy/nats-roles.conf: %s may): %w", who, roles, err)
}

func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}
