package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
	"github.com/nats-io/nats.go"
)

// clientFlags are what the subcommands that talk to a running deployment share:
// where it is, how to authenticate, its prefix.
type clientFlags struct {
	conn    client.ConnConfig
	prefix  string
	timeout time.Duration
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	c.conn.URLs = "nats://127.0.0.1:4222"
	c.prefix = "leaf"
	c.timeout = 10 * time.Second
	fs.StringVar(&c.conn.URLs, "nats", c.conn.URLs, "comma-separated NATS server URLs of the deployment")
	c.conn.RegisterFlags(fs)
	fs.StringVar(&c.prefix, "prefix", c.prefix, "subject prefix of the deployment")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "how long to wait for an answer")
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
	c.conn.Name = "leafbus dispenser cli"
	opts, err := c.conn.Options(nil)
	if err != nil {
		return nil, nil, &usageError{err}
	}
	// A command line tool should fail fast, not reconnect forever.
	opts = append(opts, nats.MaxReconnects(0), nats.Timeout(c.timeout))
	nc, err := nats.Connect(c.conn.URLs, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", client.RedactURLs(c.conn.URLs), err)
	}
	cl, err := client.NewClient(nc, client.WithPrefix(c.prefix), client.WithTimeout(c.timeout))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, cl, nil
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
