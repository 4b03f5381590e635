package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"syscall"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/cpuprofile"
	"github.com/leafbus/leafbus/internal/fdlimit"
)

// Main is the serve command: it parses its configuration, runs one dispenser (package
// dispenser) until a signal, its context or a fatal error stops it, and closes it.
type Main struct {
	Config Config
	Stdout io.Writer // the banner
	Stderr io.Writer // logs
	Getenv func(string) string

	log *slog.Logger
	d   *dispenser.Dispenser
}

// NewMain returns a Main with the defaults, writing to the process's stdout/stderr.
func NewMain() *Main {
	return &Main{
		Config: defaultConfig(),
		Stdout: os.Stdout,
		Stderr: os.Stderr,
		Getenv: os.Getenv,
	}
}

// ParseFlags reads the command line and the environment, and validates the result.
func (m *Main) ParseFlags(args []string) error {
	return m.Config.parse(args, m.Getenv, m.Stderr)
}

// Run builds the dispenser and serves until SIGINT, SIGTERM, ctx or a failing part stops
// it. A clean stop returns nil. A failed start has been undone when Run returns.
func (m *Main) Run(ctx context.Context) error {
	m.log = m.Config.logger(m.Stderr)
	if pct, ok := gcPercent(m.Getenv); ok {
		debug.SetGCPercent(pct)
	}
	// Every connection takes a descriptor: the HTTP connection cap is sized from this
	// limit (dispenser's httpConnCap), so that clients never take the last ones.
	switch before, hard, soft, err := fdlimit.Raise(); {
	case err != nil:
		m.log.Warn("open file limit", "err", err)
	case before < soft:
		m.log.Info("open file limit raised to the hard limit", "from", before, "to", soft)
	default:
		m.log.Debug("open file limit", "soft", soft, "hard", hard)
	}
	for _, note := range m.Config.notes {
		m.log.Warn("--leaf-properties: "+note, "file", m.Config.LeafProperties)
	}
	if m.Config.CPUProfile != "" {
		// The whole process as deployed: how the dispenser spends its CPU, which
		// benchmarks inside one process (the load client sharing the runtime) do not show.
		stop, err := cpuprofile.Start(m.Config.CPUProfile)
		if err != nil {
			return err
		}
		defer func() {
			if err := stop(); err != nil {
				m.log.Warn("CPU profile not written in full", "err", err)
			}
		}()
	}
	d, err := dispenser.New(ctx, m.Config.Config,
		dispenser.WithLogger(m.log),
		dispenser.WithBanner(m.Stdout),
		dispenser.WithSignals(os.Interrupt, syscall.SIGTERM),
	)
	if err != nil {
		return err
	}
	m.d = d
	return d.Run(ctx)
}

// defaultGCPercent is the dispenser's GOGC unless the environment sets one. Its live heap
// is a few MB, the embedded NATS server included, so Go's default (100) collects after
// every few MB allocated: 15 to 20 times a second under HTTP load (net/http allocates
// about 1.5 KB a request), and each collection scans the NATS server's goroutines, which
// a bare HTTP server does not have. 400 collects a quarter as often for some 20 MB more
// heap, and keeps the tail latency of both faces near a bare server's (BENCHMARKS.md,
// "HTTP: the dispenser against a bare net/http server").
const defaultGCPercent = 400

// gcPercent is the GOGC to set: defaultGCPercent, unless GOGC is in the environment
// (ok=false: the runtime already follows it).
func gcPercent(getenv func(string) string) (pct int, ok bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	return defaultGCPercent, true
}

// Close gives back what the dispenser holds. What it could not undo is logged and
// returned; it does not change the exit code, as a clean stop has already happened.
func (m *Main) Close() error {
	if m.d == nil {
		return nil
	}
	err := m.d.Close()
	if err != nil {
		m.log.Warn("close", "err", err)
	}
	return err
}
