// Command dispenser serves Leaf-style segment and snowflake IDs over NATS.
//
// With no flags it embeds a NATS server with JetStream and keeps everything it needs in
// ./leafbus-data; with --nats, --segment-store mysql and --worker-registry zk it runs
// against a production NATS cluster, MySQL (Leaf's leaf_alloc table) and ZooKeeper
// (Leaf's worker-ID layout). `dispenser --help` lists every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/leafbus/leafbus/internal/buildinfo"
)

func main() {
	os.Exit(runCommand(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// runCommand dispatches to the serve command or a subcommand and turns its error into an
// exit code: 0 on success or --help, 2 for bad flags, 1 for anything else.
func runCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 {
		switch args[0] {
		case "tag":
			err = runTag(ctx, args[1:], stdout, stderr)
			return exitCode(err, stderr)
		case "decode":
			err = runDecode(ctx, args[1:], stdout, stderr)
			return exitCode(err, stderr)
		case "schema":
			return exitCode(runSchema(args[1:], stdout, stderr), stderr)
		case "deployment":
			return exitCode(runDeployment(ctx, args[1:], stdout, stderr), stderr)
		case "fence":
			return exitCode(runFence(ctx, args[1:], stdout, stderr), stderr)
		case "reveal":
			return exitCode(runReveal(ctx, args[1:], stdout, stderr), stderr)
		case "conform":
			return exitCode(runConform(ctx, args[1:], stdout, stderr), stderr)
		case "version", "--version", "-version":
			return exitCode(runVersion(args[1:], stdout), stderr)
		}
	}
	return runServe(ctx, args, os.Getenv, stdout, stderr)
}

// runServe is the serve command (and --print-config) with its environment from getenv.
func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	m := NewMain()
	m.Stdout, m.Stderr, m.Getenv = stdout, stderr, getenv
	if err := m.ParseFlags(args); err != nil {
		return exitCode(err, stderr)
	}
	if m.Config.PrintConfig {
		return exitCode(printConfig(stdout, m.Config.fs, m.Config.sources), stderr)
	}
	err := m.Run(ctx)
	_ = m.Close() // logged by Close
	return exitCode(err, stderr)
}

func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(*usageError)):
		fmt.Fprintf(stderr, "dispenser: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "dispenser: %v\n", err)
	return 1
}

// runVersion prints the build's version line (internal/buildinfo), the one $SRV.INFO's
// build metadata, the banner, the status page and leafbus_build_info show. It is not a
// flag of the serve command, so that no LEAFBUS_VERSION in an environment turns a
// dispenser into a command that prints and exits.
func runVersion(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return &usageError{fmt.Errorf("version takes no arguments, got %q: run dispenser version", args)}
	}
	_, err := fmt.Fprintln(stdout, buildinfo.Read())
	return err
}

// usageError is a mistake on the command line (exit code 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }
