package dispenser

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
)

// Option is an optional tweak to New, for what operators do not set: where logs and the
// banner go, a clock for tests, extra tags for benchmarks. An Option may fail, and New
// then returns its error before building anything.
type Option func(*options) error

type options struct {
	logger    *slog.Logger
	banner    io.Writer
	clock     snowflake.Clock
	signals   []os.Signal
	tags      []segment.Tag
	wrapStore func(segment.Store) segment.Store

	// afterStep, when set (tests only), runs after each step of New and fails the start
	// with its error: the way to fail a step that has nothing else to fail.
	afterStep func(step stepName, d *Dispenser) error

	// Tests only: which --listen hosts count as loopback (nil: isLoopback), and how
	// often the --insecure-listen warning repeats (0: insecureWarnEvery).
	loopback          func(host string) bool
	insecureWarnEvery time.Duration

	// Tests only: how often the peers' worker-ID ranges are checked, and how often one
	// peer's conflict is logged again (0: peerCheckEvery, peerWarnEvery).
	peerCheckEvery, peerWarnEvery time.Duration

	// Tests only: how often a running dispenser reads the deployment record again
	// (0: deployment.DefaultWatchEvery).
	deploymentEvery time.Duration

	// onlySteps, when set, runs only these steps of New: the part of a start an admin
	// command needs (admin.go).
	onlySteps map[stepName]bool
}

// WithLogger sends the dispenser's logs to l (the default discards them).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("dispenser: WithLogger(nil)")
		}
		o.logger = l
		return nil
	}
}

// WithBanner writes the "leafbus is serving on ..." lines, which tell a newcomer how to
// ask for an ID, to w once the dispenser serves.
func WithBanner(w io.Writer) Option {
	return func(o *options) error {
		o.banner = w
		return nil
	}
}

// WithClock makes the clock guard, heartbeat and snowflake generator read c instead of
// the system clock: tests use a skewed snowflake.FakeClock.
func WithClock(c snowflake.Clock) Option {
	return func(o *options) error {
		if c == nil {
			return errors.New("dispenser: WithClock(nil)")
		}
		o.clock = c
		return nil
	}
}

// WithSignals makes Run stop cleanly (returning nil) when the process receives one of
// sigs, as oklog/run's SignalHandler does. Without it Run stops only when its context
// ends or a part fails.
func WithSignals(sigs ...os.Signal) Option {
	return func(o *options) error {
		if len(sigs) == 0 {
			return errors.New("dispenser: WithSignals with no signal")
		}
		o.signals = sigs
		return nil
	}
}

// WithTags creates each of tags that the segment store does not have yet, right after
// the store opens, so they are loaded before the dispenser serves (as the sample tag is).
func WithTags(tags ...segment.Tag) Option {
	return func(o *options) error {
		for _, t := range tags {
			if err := segment.CheckTagName(t.Name); err != nil {
				return err
			}
		}
		o.tags = append(o.tags, tags...)
		return nil
	}
}

// WrapSegmentStore puts wrap around the segment store once it is open (and the tags are
// in): bench slows every call down this way, as a distant database would.
func WrapSegmentStore(wrap func(segment.Store) segment.Store) Option {
	return func(o *options) error {
		if wrap == nil {
			return errors.New("dispenser: WrapSegmentStore(nil)")
		}
		o.wrapStore = wrap
		return nil
	}
}
