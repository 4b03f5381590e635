package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// run carries out the whole bench: the dispenser phase, the check, and the echo baseline.
// It returns an error only when the run could not be carried out; what the run found
// (errors, duplicates) is in the report. progressOut nil keeps the live line quiet.
func run(ctx context.Context, cfg Config, logger *slog.Logger, progressOut io.Writer) (*Report, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Embedded {
		url, stop, err := startEmbedded(ctx, cfg, logger)
		if err != nil {
			return nil, fmt.Errorf("--embedded: %w", err)
		}
		defer stop()
		cfg.Conn.URLs = url
	}
	subjects, err := wire.NewSubjects(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	clients, err := connectClients(cfg, logger)
	defer closeClients(clients)
	if err != nil {
		return nil, err
	}

	target := func(tag string) string { return subjects.IDs(cfg.Kind, tag) }
	if cfg.HTTP != "" {
		target = func(tag string) string { return leafURL(cfg.HTTP, cfg.Kind, tag, cfg.Batch) }
	}
	spec := newLoadSpec(cfg, "dispenser", target)
	if cfg.Check {
		spaces := 1
		if cfg.Kind == wire.Segment {
			spaces = len(spec.subjects)
		}
		for range spaces {
			chk, err := newChecker(cfg.CheckSpill, max(cfg.CheckMem/spaces, 1), cfg.Clients)
			if err != nil {
				return nil, err
			}
			defer chk.close()
			spec.checks = append(spec.checks, chk)
		}
		spec.monotonic = cfg.Kind == wire.Segment
	}
	res, err := runLoad(ctx, clients, spec, progressOut, logger)
	if err != nil {
		return nil, err
	}
	rep := newReport(cfg)
	rep.Dispenser = phaseReport(res)
	if len(spec.checks) > 0 {
		var found checkResult
		for i, chk := range spec.checks {
			r, err := chk.finish(res.collectors[i])
			if err != nil {
				return nil, fmt.Errorf("check for duplicates: %w", err)
			}
			found.add(r)
		}
		rep.Check = checkReport(found, spec.monotonic, res.regressions)
	}
	for _, where := range cfg.baselines() {
		if ctx.Err() != nil {
			break
		}
		b := runEchoBaseline(ctx, cfg, where, subjects, clients, spec, &rep.Dispenser, progressOut, logger)
		if where == baselineEchoProcess {
			rep.BaselineProcess = b
		} else {
			rep.Baseline = b
		}
	}
	rep.Interrupted = ctx.Err() != nil
	return rep, nil
}

// newLoadSpec turns the configuration into a phase, with subject naming a tag's subject.
func newLoadSpec(cfg Config, label string, subject func(tag string) string) *loadSpec {
	s := &loadSpec{
		label: label, batch: cfg.Batch, enc: cfg.Encoding,
		clients: cfg.Clients, inflight: cfg.Inflight, rate: cfg.Rate,
		warmup: cfg.Warmup, duration: cfg.Duration, requests: cfg.Requests, timeout: cfg.Timeout,
	}
	for _, tag := range cfg.Tags {
		s.subjects = append(s.subjects, subject(tag))
	}
	if cfg.Batch > 1 {
		s.body = []byte(strconv.Itoa(cfg.Batch))
	}
	if s.enc != wire.Text { // text is the default: a plain client sends no header
		s.header = nats.Header{wire.EncodingHeader: []string{s.enc.String()}}
	}
	return s
}

// echoResponders is a running echo baseline, in this process or in its own.
type echoResponders interface {
	subject(tag string) string // where the echo copy of a request for tag goes
	stop()
}

// runEchoBaseline repeats the dispenser's load against a bare NATS responder, in this
// process (where is baselineEcho) or in a `bench echo` process (baselineEchoProcess). A
// baseline that cannot run says why in its report instead of failing the run, whose
// dispenser numbers stand on their own.
func runEchoBaseline(ctx context.Context, cfg Config, where string, subjects wire.Subjects, clients []*benchConn, spec *loadSpec, disp *PhaseReport, progressOut io.Writer, logger *slog.Logger) *BaselineReport {
	b := &BaselineReport{Where: "in-process"}
	if where == baselineEchoProcess {
		b.Where = "own process"
	}
	payloads, err := sampleReplies(clients[0].nc, spec)
	if err != nil {
		b.Error = err.Error()
		return b
	}
	for _, p := range payloads {
		b.PayloadBytes = append(b.PayloadBytes, len(p))
	}
	b.Responders, b.RespondersSource = echoResponderCount(cfg, subjects, clients[0].nc, spec.subjects[0], logger)
	var echo echoResponders
	if where == baselineEchoProcess {
		echo, err = startEchoProcess(ctx, cfg, b.Responders)
	} else {
		echo, err = startEcho(cfg.Conn, newEchoPrefix(), cfg.Tags, payloads, b.Responders, logger)
	}
	if err != nil {
		b.Error = err.Error()
		return b
	}
	defer echo.stop()
	echoSpec := *spec
	echoSpec.label, echoSpec.checks, echoSpec.monotonic, echoSpec.subjects = "echo", nil, false, nil
	if where == baselineEchoProcess {
		echoSpec.label = "echo-process"
	}
	for _, tag := range cfg.Tags {
		echoSpec.subjects = append(echoSpec.subjects, echo.subject(tag))
	}
	res, err := runLoad(ctx, clients, &echoSpec, progressOut, logger)
	if err != nil {
		b.Error = err.Error()
		return b
	}
	e := phaseReport(res)
	b.Echo = &e
	b.Ratios = ratios(disp, &e)
	return b
}

// echoResponderCount is how many responders the echo gets, and why: --echo-responders,
// else as many endpoint instances as serve the subject, else one.
func echoResponderCount(cfg Config, subjects wire.Subjects, nc *nats.Conn, subject string, logger *slog.Logger) (int, string) {
	if cfg.EchoResponders > 0 {
		return cfg.EchoResponders, "--echo-responders"
	}
	n, err := countResponders(nc, subjects.Service(), subject, time.Second)
	switch {
	case err != nil:
		logger.Warn("cannot count the dispenser's endpoints; the echo gets one responder", "err", err)
		return 1, "default: $SRV.INFO failed"
	case n == 0:
		return 1, "default: no micro service answered $SRV.INFO." + subjects.Service()
	}
	return n, "endpoints serving the subject in $SRV.INFO." + subjects.Service()
}
