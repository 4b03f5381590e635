package testutil

import (
	"io"
	"log/slog"
	"strings"
	"testing"
)

// Logger returns a debug-level text logger writing to LogWriter(tb): its lines show
// only when the test fails (or with go test -v).
func Logger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(tb), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// LogWriter returns a writer that hands each Write to tb.Log, without its trailing
// newline. A logger writes one line per Write, so each line becomes one test log entry.
// It must not be written to after the test ended: stop background loops first.
func LogWriter(tb testing.TB) io.Writer { return tbWriter{tb} }

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
