package testutil

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer that code under test may write (a logger, a process's
// stderr, a NATS callback) while the test reads it. The zero value is ready to use.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Line returns the first line that contains any of subs, or "" when none does.
func (b *SyncBuffer) Line(subs ...string) string {
	for l := range strings.SplitSeq(b.String(), "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) {
				return l
			}
		}
	}
	return ""
}

// WaitLine waits until a line contains any of subs and returns it; after within it
// fails tb, printing what was written.
func (b *SyncBuffer) WaitLine(tb testing.TB, within time.Duration, subs ...string) string {
	tb.Helper()
	var line string
	waitUntil(within, func() bool { line = b.Line(subs...); return line != "" })
	if line == "" {
		tb.Fatalf("no line with any of %q within %v; written:\n%s", subs, within, b.String())
	}
	return line
}
