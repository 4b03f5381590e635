package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
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
	defer spec.closeChecks()
	if err := spec.addChecks(cfg); err != nil {
		return nil, err
	}
	var baselines []*baseline
	defer func() {
		for _, b := range baselines {
			b.stop()
		}
	}()
	setUp := func() []*baseline {
		for _, where := range cfg.baselines() {
			baselines = append(baselines, setUpBaseline(ctx, cfg, where, subjects, clients, spec, logger))
		}
		return baselines
	}
	res, err := runRounds(ctx, cfg, clients, spec, setUp, progressOut, logger)
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
	rep.addBaselines(baselines)
	rep.Interrupted = ctx.Err() != nil
	return rep, nil
}

// addChecks gives spec the checkers of --check, one per ID space: one per tag for
// segment IDs, one for all snowflake IDs. The caller closes them (closeChecks), also
// after an error.
func (s *loadSpec) addChecks(cfg Config) error {
	if !cfg.Check {
		return nil
	}
	spaces := 1
	if cfg.Kind == wire.Segment {
		spaces = len(s.subjects)
	}
	for range spaces {
		chk, err := newChecker(cfg.CheckSpill, max(cfg.CheckMem/spaces, 1), cfg.Clients)
		if err != nil {
			return err
		}
		s.checks = append(s.checks, chk)
	}
	s.monotonic = cfg.Kind == wire.Segment
	return nil
}

// closeChecks releases the checkers (their spill files).
func (s *loadSpec) closeChecks() {
	for _, chk := range s.checks {
		chk.close()
	}
}

// addBaselines puts each baseline's report, with its echo phase and the ratios to the
// dispenser's, into r.
func (r *Report) addBaselines(baselines []*baseline) {
	for _, b := range baselines {
		if b.res != nil {
			e := phaseReport(b.res)
			b.report.Echo = &e
			b.report.Ratios = ratios(&r.Dispenser, &e)
			b.report.MedianRoundRatio = median(b.report.RoundRatios)
		}
		if b.where == baselineEchoProcess {
			r.BaselineProcess = b.report
		} else {
			r.Baseline = b.report
		}
	}
}

// runRounds runs the dispenser's phase, then each baseline's, --rounds times over, and
// returns the dispenser's results summed over the rounds (the baselines keep theirs).
// The baselines are set up (setUp) after the dispenser's first phase: the echo's canned
// replies are sampled from the dispenser then, so they have the size its replies have
// under load (a fresh tag's first IDs are shorter).
func runRounds(ctx context.Context, cfg Config, clients []*benchConn, spec *loadSpec, setUp func() []*baseline, progressOut io.Writer, logger *slog.Logger) (*phaseResult, error) {
	rounds := max(cfg.Rounds, 1)
	var total *phaseResult
	var baselines []*baseline
	for r := range rounds {
		if r > 0 && ctx.Err() != nil {
			break
		}
		res, err := runLoad(ctx, clients, spec.round(r, rounds), progressOut, logger)
		if err != nil {
			return nil, err
		}
		total = total.merge(res)
		if r == 0 && ctx.Err() == nil {
			baselines = setUp()
		}
		for _, b := range baselines {
			if b.echo == nil || ctx.Err() != nil {
				continue
			}
			echoRes, err := runLoad(ctx, clients, b.spec.round(r, rounds), progressOut, logger)
			if err != nil {
				b.report.Error = err.Error()
				b.stop()
				continue
			}
			if d, e := res.requestsPerS(), echoRes.requestsPerS(); e > 0 {
				b.report.RoundRatios = append(b.report.RoundRatios, d/e)
			}
			b.res = b.res.merge(echoRes)
		}
	}
	return total, nil
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
	s.cpuPIDs = map[string]int{cpuBench: os.Getpid()}
	maps.Copy(s.cpuPIDs, cfg.CPUPIDs)
	return s
}

// echoResponders is a running echo baseline, in this process or in its own.
type echoResponders interface {
	subject(tag string) string // where the echo copy of a request for tag goes
	stop()
}

// baseline is one echo comparison: its report, its responders (nil once it failed),
// the load it gets (the dispenser's, on the echo's subjects) and its results so far.
type baseline struct {
	where  string // baselineEcho or baselineEchoProcess
	report *BaselineReport
	echo   echoResponders
	spec   *loadSpec
	res    *phaseResult
}

// stop stops the responders; the report stays.
func (b *baseline) stop() {
	if b.echo != nil {
		b.echo.stop()
		b.echo = nil
	}
}

// setUpBaseline starts a bare NATS responder, in this process (where is baselineEcho) or
// in a `bench echo` process (baselineEchoProcess), answering with the dispenser's reply
// bytes. A baseline that cannot run says why in its report instead of failing the run,
// whose dispenser numbers stand on their own.
func setUpBaseline(ctx context.Context, cfg Config, where string, subjects wire.Subjects, clients []*benchConn, spec *loadSpec, logger *slog.Logger) *baseline {
	b := &baseline{where: where, report: &BaselineReport{Where: "in-process"}}
	if where == baselineEchoProcess {
		b.report.Where = "own process"
	}
	payloads, err := sampleReplies(clients[0].nc, spec)
	if err != nil {
		b.report.Error = err.Error()
		return b
	}
	for _, p := range payloads {
		b.report.PayloadBytes = append(b.report.PayloadBytes, len(p))
	}
	b.report.Responders, b.report.RespondersSource = echoResponderCount(cfg, subjects, clients[0].nc, spec.subjects[0], logger)
	if where == baselineEchoProcess {
		b.echo, err = startEchoProcess(ctx, cfg, b.report.Responders)
	} else {
		b.echo, err = startEcho(cfg.Conn, wire.Subjects{Prefix: cfg.Prefix}, newEchoPrefix(), cfg.Tags, payloads, b.report.Responders, logger)
	}
	if err != nil {
		b.report.Error = err.Error()
		return b
	}
	echoSpec := *spec
	echoSpec.label, echoSpec.checks, echoSpec.monotonic, echoSpec.subjects = where, nil, false, nil
	for _, tag := range cfg.Tags {
		echoSpec.subjects = append(echoSpec.subjects, b.echo.subject(tag))
	}
	if p, ok := b.echo.(*echoProcess); ok {
		echoSpec.cpuPIDs = maps.Clone(spec.cpuPIDs)
		echoSpec.cpuPIDs[cpuEcho] = p.cmd.Process.Pid
	}
	b.spec = &echoSpec
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
