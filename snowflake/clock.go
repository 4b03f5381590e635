package snowflake

import (
	"runtime"
	"time"
)

// Clock is the wall clock a Generator reads. Sleep lets a fake clock advance time when the
// generator waits.
//
// A Generator calls both while holding its lock, so they must not call back into it; they
// may be called from any goroutine.
type Clock interface {
	// Now returns the current wall-clock time; only its Unix milliseconds (and, for waits,
	// the part below a millisecond) matter.
	Now() time.Time
	// Sleep returns after about d has passed on this clock; d <= 0 returns at once.
	Sleep(d time.Duration)
}

// spinBelow is the longest sleep the system clock spins through instead of parking:
// the runtime's timers wake a parked goroutine a millisecond or more late here (measured:
// time.Sleep(200µs) takes 1.1 ms at the median), which would waste the next millisecond of a
// saturated generator waiting for its sequence to renew.
const spinBelow = 2 * time.Millisecond

// systemClock is the machine's clock.
type systemClock struct{}

// SystemClock returns the machine's wall clock. Its Sleep spins (yielding the processor)
// for waits under 2ms, because parking a goroutine for less than that costs about a
// millisecond more than asked, and parks for longer ones.
func SystemClock() Clock { return systemClock{} }

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	if d >= spinBelow {
		time.Sleep(d)
		return
	}
	start := time.Now() // its monotonic reading times the spin, immune to wall-clock steps
	for time.Since(start) < d {
		runtime.Gosched()
	}
}
