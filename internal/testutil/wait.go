package testutil

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Context returns a context that ends after d, as a guard against a hang, or when the
// test ends, whichever comes first.
func Context(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// Eventually polls cond until it returns true; after within it fails tb with "waited
// <within> for <what>". The polls start a millisecond apart and slow to 20ms, so a
// quick condition is seen at once and a slow one does not burn a shared CPU.
func Eventually(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !waitUntil(within, cond) {
		tb.Fatalf("waited %v for %s", within, what)
	}
}

// waitUntil polls cond until it returns true (true) or within passed (false).
func waitUntil(within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		select {
		case <-deadline.C:
			return cond()
		case <-time.After(pause):
		}
	}
	return true
}

// stopWithin bounds how long the stop function of Run waits for the actor to return.
const stopWithin = 10 * time.Second

// Run starts run in a goroutine, as an oklog/run actor, with a context that the
// returned stop function cancels. stop then waits for run to return, and fails tb if
// it returned an error or did not return within 10s. stop runs at cleanup if the test
// did not call it; calling it again does nothing.
func Run(tb testing.TB, what string, run func(ctx context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("%s returned %v, want nil", what, err)
				}
			case <-time.After(stopWithin):
				tb.Errorf("%s did not return within %v of its context ending", what, stopWithin)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
