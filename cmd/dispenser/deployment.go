package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/leafbus/leafbus/dispenser"
)

const deploymentUsage = `Usage: dispenser deployment show [the dispensers' flags]
       dispenser deployment set [--confirm] [--revision N] [--drop-other-registries] [the dispensers' flags]

The deployment record (KV bucket <prefix>_deployment, key deployment) says what the
deployment is: its segment store, its worker registries and the worker IDs each hands
out, its snowflake layout and epoch, its monotonic tags. The first dispenser of a
deployment with no live dispenser writes it; every other refuses to start unless it
fits, naming each difference and the flag that would fix it. The record follows the
running fleet: they write it back when it is gone, and refuse (and write back over) a
change they contradict.

show prints the record. set computes the record from the flags as a start would (the
segment store and the worker registry are opened to ask them which they are) and shows
how it differs from the current one; with --confirm it writes it, over the revision it
read (or --revision N, the one you checked): a compare-and-set, refused if the record
changed meanwhile, and refused while a live dispenser of the prefix does not fit the new
record (it is named: stop it first). The monotonic tags and the registries of other
worker IDs are kept.

Give the flags the dispensers run with: --nats and the credentials (with the roles of
deploy/nats-roles.conf, the dispenser's user), --prefix, --segment-store, --mysql-dsn,
--worker-registry, --zk-name, --epoch, --worker-id-min/max. Without --nats the record is
the embedded server's, in --data-dir: stop that dispenser first, or reach it with
--nats nats://127.0.0.1:4222.

Flags:
`

// deploymentCommand is `dispenser deployment show|set`.
type deploymentCommand struct {
	op     string
	cfg    Config
	set    dispenser.SetOptions
	stdout io.Writer
	stderr io.Writer
}

func runDeployment(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "show" && args[0] != "set") {
		fmt.Fprint(stderr, deploymentUsage)
		return &usageError{errors.New("deployment: want show or set")}
	}
	c := &deploymentCommand{op: args[0], cfg: defaultConfig(), stdout: stdout, stderr: stderr}
	fs := adminFlagSet(&c.cfg, "dispenser deployment "+c.op, deploymentUsage, stderr)
	if c.op == "set" {
		fs.BoolVar(&c.set.Confirm, "confirm", false, "write the record (without it: only show what would be written)")
		fs.Uint64Var(&c.set.Revision, "revision", 0, "write only over this revision of the record (what show printed); 0: the one read now")
		fs.BoolVar(&c.set.DropOthers, "drop-other-registries", false, "keep no worker registry but this configuration's (a datacenter given up)")
	}
	if err := c.cfg.parseFlags(fs, args[1:], os.Getenv); err != nil {
		return err
	}
	if c.op == "show" {
		return c.show(ctx)
	}
	return c.write(ctx)
}

func (c *deploymentCommand) show(ctx context.Context) error {
	v, err := dispenser.ShowDeployment(ctx, c.cfg.Config, dispenser.WithLogger(c.cfg.logger(c.stderr)))
	if err != nil {
		return err
	}
	if err := printView(c.stdout, v); err != nil {
		return err
	}
	return v.Err // unreadable: exit 1, saying why
}

func (c *deploymentCommand) write(ctx context.Context) error {
	ch, err := dispenser.SetDeployment(ctx, c.cfg.Config, c.set, dispenser.WithLogger(c.cfg.logger(c.stderr)))
	if ch.Current.Bucket == "" && err != nil {
		return err // nothing read
	}
	if perr := printView(c.stdout, ch.Current); perr != nil {
		return perr
	}
	if len(ch.Differences) > 0 {
		fmt.Fprintln(c.stdout, "\nthese flags differ from it:")
		for _, d := range ch.Differences {
			fmt.Fprintf(c.stdout, "  - %s\n", d)
		}
	} else if ch.Current.Record != nil {
		fmt.Fprintln(c.stdout, "\nthese flags fit it")
	}
	fmt.Fprintln(c.stdout, "\nthe record from these flags:")
	if perr := printJSON(c.stdout, ch.Next); perr != nil {
		return perr
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "written: revision %d of KV bucket %s\n", ch.Revision, ch.Current.Bucket)
	return nil
}

// printView prints the record as stored, with its revision; an unreadable one as it is.
func printView(w io.Writer, v dispenser.DeploymentView) error {
	switch {
	case v.Raw == nil:
		_, err := fmt.Fprintf(w, "no deployment record in KV bucket %s (the first dispenser to start writes one)\n", v.Bucket)
		return err
	case v.Record == nil:
		_, err := fmt.Fprintf(w, "KV bucket %s, key deployment, revision %d, unreadable:\n%s\n", v.Bucket, v.Revision, v.Raw)
		return err
	}
	fmt.Fprintf(w, "KV bucket %s, key deployment, revision %d:\n", v.Bucket, v.Revision)
	return printJSON(w, json.RawMessage(v.Raw))
}

// adminFlagSet is the serve flags on cfg, with usage as the subcommand's help: an
// admin command computes what a start would, from the same flags.
func adminFlagSet(cfg *Config, name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := cfg.flagSet(stderr)
	fs.Init(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}
