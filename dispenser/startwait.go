package dispenser

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/workerid"
)

// A dispenser often starts together with what it depends on: a NATS cluster whose
// JetStream is still electing its leaders ("no responders"), MySQL or ZooKeeper coming
// up. The steps of New that reach a dependency are therefore tried again, backing off,
// until --start-timeout has passed since New began, each wait logged with its reason.
// What a failed attempt built is undone before the next. A failure that says starting
// would be unsafe, or that the configuration is wrong (retryable), is not waited out:
// New refuses at once, saying why.

// startRetry spaces the attempts of a step waiting for a dependency.
var startRetry = backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}

// startAttemptMax bounds one attempt of a step: a JetStream request that nobody answers
// (no meta leader yet) waits as long as it is let. The steps that take the worker ID
// and check the clock may wait longer on purpose: startWaitMax, on top of the clock's
// own waits, covers a ZooKeeper session awaited (5 s) or another run's alive node
// expiring (a 10 s session).
const (
	startAttemptMax = 4 * time.Second
	startWaitMax    = 12 * time.Second
)

// waitsForDependency reports whether step reaches a dependency that may still be
// starting. The embedded NATS server is this process's own: a failure to start it is
// not waited out.
func (d *Dispenser) waitsForDependency(step string) bool {
	switch step {
	case "nats":
		return d.cfg.NATS != ""
	case "mysql", "segment store", "worker registry", "worker ID", "clock check", "heartbeat", "pools":
		return true
	}
	return false
}

// runStep runs s, and again while it fails for a reason worth waiting out and deadline
// (New's start plus StartTimeout) is not reached.
func (d *Dispenser) runStep(ctx context.Context, s step, deadline time.Time) error {
	if !d.waitsForDependency(s.name) {
		return s.run(ctx)
	}
	retry := backoff.New(startRetry)
	began := time.Now()
	// An attempt may itself wait on its dependency (a request nobody answers, a
	// ZooKeeper session awaited) or on the clock (the guard): it is bounded by the
	// longest such wait, so that a hung attempt is tried again rather than waited for.
	attemptMax := startAttemptMax
	if s.name == "worker ID" || s.name == "clock check" {
		attemptMax = startWaitMax + d.cfg.ClockWaitMax + HeartbeatInterval + d.cfg.clockMargin()
	}
	for {
		mark := len(d.closers)
		actx, cancel := context.WithTimeout(ctx, attemptMax)
		err := s.run(actx)
		cancel()
		if err == nil {
			if retry.Failures() > 0 {
				d.log.Info("ready after waiting", "step", s.name, "waited", time.Since(began).Round(time.Millisecond), "attempts", retry.Failures()+1)
			}
			return nil
		}
		d.undoSince(mark)
		if ctx.Err() != nil || !retryable(err) {
			return err
		}
		wait := retry.Next()
		if time.Now().Add(wait).After(deadline) {
			if retry.Failures() == 1 && d.cfg.StartTimeout == 0 {
				return err
			}
			return fmt.Errorf("not ready within --start-timeout %s (%d attempts): %w", d.cfg.StartTimeout, retry.Failures(), err)
		}
		d.log.Warn("waiting for a dependency to become ready", "step", s.name, "err", err,
			"retry_in", wait.Round(time.Millisecond), "attempt", retry.Failures(), "gives_up_in", time.Until(deadline).Round(time.Second))
		if !backoff.Sleep(ctx, wait) {
			return err
		}
	}
}

// undoSince undoes what was registered with onClose from mark on, last first: what a
// failed attempt of a step built.
func (d *Dispenser) undoSince(mark int) {
	for i := len(d.closers) - 1; i >= mark; i-- {
		if err := d.closers[i].undo(); err != nil {
			d.log.Warn("undo a failed attempt", "part", d.closers[i].name, "err", err)
		}
	}
	d.closers = d.closers[:mark]
}

// retryable tells a failure worth waiting out (a dependency not reachable yet, every
// worker ID taken for now) from one that says going on would be unsafe or the
// configuration is wrong, which no wait mends: the worker identity's refusals
// (workerid.IsRefusal) and the segment store's.
func retryable(err error) bool {
	if workerid.IsRefusal(err) {
		return false
	}
	for _, refusal := range []error{segment.ErrStoreWentBack, segment.ErrNoLeafAlloc, segment.ErrCorruptMarks} {
		if errors.Is(err, refusal) {
			return false
		}
	}
	return true
}
