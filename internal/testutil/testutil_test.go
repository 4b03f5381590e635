package testutil_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

// recordingTB is a testing.TB that records what the helpers report instead of failing
// the real test; Fatalf ends the goroutine as testing's does.
type recordingTB struct {
	testing.TB
	mu       sync.Mutex
	logs     []string
	errs     []string
	cleanups []func()
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Log(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprint(args...))
}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}
func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// call runs f with r in its own goroutine, so that a Fatalf ends only that goroutine.
func (r *recordingTB) call(f func(tb testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
}

func (r *recordingTB) failures() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.errs, "\n")
}

func TestLogger(t *testing.T) {
	r := &recordingTB{TB: t}
	testutil.Logger(r).Debug("loaded", "tag", "orders")
	if len(r.logs) != 1 || !strings.Contains(r.logs[0], "level=DEBUG msg=loaded tag=orders") || strings.HasSuffix(r.logs[0], "\n") {
		t.Fatalf("Logger(tb).Debug logged %q, want one debug line without its newline", r.logs)
	}
}

func TestSyncBuffer(t *testing.T) {
	var b testutil.SyncBuffer
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { fmt.Fprintf(&b, "writer %d done\n", i) })
	}
	if got := b.WaitLine(t, 5*time.Second, "writer 3 done"); got != "writer 3 done" {
		t.Errorf("WaitLine = %q, want the writer's line", got)
	}
	wg.Wait()
	if got := b.Line("nobody", "writer 0"); got != "writer 0 done" {
		t.Errorf("Line(nobody, writer 0) = %q, want %q", got, "writer 0 done")
	}
	if got := b.Line("nobody"); got != "" {
		t.Errorf("Line(nobody) = %q, want \"\"", got)
	}

	r := &recordingTB{TB: t}
	r.call(func(tb testing.TB) { b.WaitLine(tb, 10*time.Millisecond, "never written") })
	if got := r.failures(); !strings.Contains(got, `no line with any of ["never written"] within 10ms`) || !strings.Contains(got, "writer 2 done") {
		t.Errorf("WaitLine for a missing line reported %q, want the wait and what was written", got)
	}
}

func TestEventually(t *testing.T) {
	polls := 0
	testutil.Eventually(t, 5*time.Second, "the third poll", func() bool { polls++; return polls == 3 })

	r := &recordingTB{TB: t}
	began := time.Now()
	r.call(func(tb testing.TB) {
		testutil.Eventually(tb, 30*time.Millisecond, "a condition that never holds", func() bool { return false })
	})
	if got := r.failures(); got != "waited 30ms for a condition that never holds" {
		t.Errorf("Eventually reported %q, want the wait and what", got)
	}
	if d := time.Since(began); d < 30*time.Millisecond || d > 5*time.Second {
		t.Errorf("Eventually(30ms) gave up after %v", d)
	}
}

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		run     func(ctx context.Context) error
		wantErr string
	}{
		{"OK", func(ctx context.Context) error { <-ctx.Done(); return nil }, ""},
		{"ReturnedByItself", func(ctx context.Context) error { return nil }, ""},
		{"Error", func(ctx context.Context) error { <-ctx.Done(); return errors.New("boom") }, "actor returned boom, want nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recordingTB{TB: t}
			stop := testutil.Run(r, "actor", tt.run)
			stop()
			stop() // twice: nothing more
			for _, f := range r.cleanups {
				f()
			}
			if got := r.failures(); got != tt.wantErr {
				t.Errorf("Run reported %q, want %q", got, tt.wantErr)
			}
		})
	}
}

func TestContext(t *testing.T) {
	ctx := testutil.Context(t, time.Hour)
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > time.Hour {
		t.Errorf("Context(1h) deadline %v, %v; want one within the hour", dl, ok)
	}
}

func TestOffsetClock(t *testing.T) {
	c := testutil.OffsetClock{Offset: -2 * time.Second}
	if d := time.Since(c.Now()); d < 2*time.Second || d > 3*time.Second {
		t.Errorf("OffsetClock{-2s}.Now() is %v behind, want about 2s", d)
	}
	began := time.Now()
	c.Sleep(5 * time.Millisecond)
	c.Sleep(-time.Second)
	if d := time.Since(began); d < 5*time.Millisecond {
		t.Errorf("Sleep(5ms) then Sleep(-1s) took %v, want at least 5ms", d)
	}
}

func TestCheckErr(t *testing.T) {
	errBoom := errors.New("boom")
	wrapped := fmt.Errorf("Size 0 must be between 1 and 9: %w", errBoom)
	tests := []struct {
		name     string
		err      error
		wantErr  error
		wantMsg  string
		wantFail string // "" when CheckErr must pass
	}{
		{"OKNoError", nil, nil, "", ""},
		{"OKSentinel", wrapped, errBoom, "", ""},
		{"OKSentinelAndMessage", wrapped, errBoom, "Size 0", ""},
		{"OKMessageOnly", wrapped, nil, "between 1 and 9", ""},
		{"FailUnexpected", wrapped, nil, "", "call: unexpected error"},
		{"FailMissingError", nil, errBoom, "", "call: error <nil>, want one wrapping boom"},
		{"FailOtherSentinel", errors.New("other"), errBoom, "", "want one wrapping boom"},
		{"FailMessage", wrapped, errBoom, "Size 1", `want a message containing "Size 1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recordingTB{TB: t}
			r.call(func(tb testing.TB) { testutil.CheckErr(tb, "call", tt.err, tt.wantErr, tt.wantMsg) })
			got := r.failures()
			if tt.wantFail == "" && got != "" || !strings.Contains(got, tt.wantFail) {
				t.Errorf("CheckErr reported %q, want %q", got, tt.wantFail)
			}
		})
	}
}

// TestBrokenPromises: a reply is judged against the replies received before it was
// sent, and only those: one sent before an earlier-received reply arrived may be below it.
func TestBrokenPromises(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	replies := []testutil.Reply{
		{First: 10, Last: 12, Sent: ms(0), Recv: ms(5)},
		{First: 1, Last: 3, Sent: ms(1), Recv: ms(6)},    // sent before [10..12] arrived: fine
		{First: 13, Last: 13, Sent: ms(7), Recv: ms(8)},  // above everything received by 7
		{First: 11, Last: 11, Sent: ms(9), Recv: ms(10)}, // below 13, received at 8: broken
	}
	got := testutil.BrokenPromises(replies)
	if len(got) != 1 || got[0] != (testutil.Broken{Reply: 3, Above: 13}) {
		t.Fatalf("BrokenPromises = %+v, want reply 3 below 13", got)
	}
	if d := testutil.Duplicates([]int64{5, 1, 5, 2, 5}); len(d) != 2 || d[0] != 5 || d[1] != 5 {
		t.Fatalf("Duplicates = %v, want [5 5]", d)
	}
}
