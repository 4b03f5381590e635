// Command bench is leafbus's load tester. It speaks only the wire protocol (NATS
// request/reply, PROTOCOL.md) to a running deployment, or to a dispenser it starts in
// process with --embedded, or with --http Leaf's HTTP API to any server that has it
// (leafbus's gateway, Leaf itself), and reports throughput, errors by code and latency
// percentiles. Like wrk2 it has an open loop (--rate) whose latency counts from when a
// request was due, so queueing cannot hide behind a slowed-down client; like a plain
// client it has a closed loop (--clients x --inflight pipelined requests).
//
// What the numbers mean:
//   - Only requests sent after --warmup are measured; their count is bounded by
//     --requests and/or --duration.
//   - requests/s and IDs/s count good replies over the time from the end of the warm-up
//     to the last measured request's completion (reply or timeout).
//   - Latency percentiles (an HDR-style histogram, within 1% from 1 µs to 60 s) are of
//     good replies; errors are counted by Nats-Service-Error-Code (the HTTP status with
//     --http), no_responders, timeout, bad_reply (a body that breaks PROTOCOL.md), send
//     and transport (an HTTP request with no answer at all).
//   - --check keeps every ID received, warm-up and late replies included, and reports
//     duplicates (exit status 1) and, for segment IDs, replies that go below the same
//     client's previous one for the tag (information only: PROTOCOL.md promises
//     trend-increasing, not monotonic). IDs out of order inside one reply always fail.
//   - --baseline echo then repeats the identical load against a bare NATS responder on
//     the same server that answers with a real reply's bytes; dispenser/echo per metric
//     is what the dispenser costs over NATS itself. The echo run keeps no IDs, so for
//     a clean ratio leave --check off. --baseline echo-process runs the responder in a
//     process of its own (`bench echo`, started by bench), as a dispenser is deployed;
//     the in-process echo shares the bench's runtime with the load clients instead.
//   - --rounds N cuts the measured part into N rounds in which the dispenser and each
//     baseline take turns, so a busy spell of a shared host falls on every phase alike;
//     each round's requests/s ratio and their median are reported beside the totals.
//   - --cpu-pid [label=]pid adds the CPU time (user + system, Linux /proc, 10 ms clock)
//     that process used per good reply in each phase, beside the bench's own and an
//     echo process's: on a busy machine it moves far less than requests/s.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/leafbus/leafbus/internal/cpuprofile"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailed  = 1 // a duplicate ID or IDs out of order in a reply
	exitTrouble = 2 // bad flags, or the run could not be carried out
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	switch {
	case len(os.Args) > 1 && os.Args[1] == "echo":
		code = echoMain(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
	case len(os.Args) > 1 && os.Args[1] == "http-echo":
		code = httpEchoMain(ctx, os.Args[2:], os.Stdout, os.Stderr)
	default:
		code = bench(ctx, os.Args[1:], os.Stdout, os.Stderr, terminal(os.Stderr))
	}
	stop()
	os.Exit(code)
}

// bench is main with its surroundings passed in: flags, then config, run, report.
func bench(ctx context.Context, args []string, stdout, stderr io.Writer, live bool) int {
	cfg, err := parseFlags(args, stderr, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitTrouble
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var progressOut io.Writer
	if live {
		progressOut = stderr
	}
	if cfg.CPUProfile != "" {
		stopProfile, err := cpuprofile.Start(cfg.CPUProfile) // with --embedded, the dispenser's too
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return exitTrouble
		}
		defer func() {
			if err := stopProfile(); err != nil {
				fmt.Fprintln(stderr, "bench:", err)
			}
		}()
	}
	rep, err := run(ctx, cfg, logger, progressOut)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitTrouble
	}
	if cfg.JSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "bench: write report:", err)
		return exitTrouble
	case rep.Failed():
		return exitFailed
	case rep.baselineFailed():
		return exitTrouble
	}
	return exitOK
}
