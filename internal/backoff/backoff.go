package backoff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy is exponential back-off: the wait before the first retry is Min, each further
// one doubles, and none exceeds Max. Jitter then takes a random share off each wait:
// a wait of d becomes uniform in [d*(1-Jitter), d]. Policies are values, usually
// package-level variables; Validate one that comes from configuration.
type Policy struct {
	// Min is the floor: the wait before the first retry, before jitter. > 0.
	Min time.Duration
	// Max is the cap of any wait, before jitter. > 0; a Max below Min makes every wait
	// Max (a caller's cap wins over a package's floor).
	Max time.Duration
	// Jitter is the share of each wait that is random, 0 to 1: 0 waits exactly, 0.5
	// waits between half and all of it ("equal jitter"), 1 anywhere from nothing to all
	// of it ("full jitter").
	Jitter float64
}

// Validate reports the first field out of range, naming the field, its value and the
// bound.
func (p Policy) Validate() error {
	switch {
	case p.Min <= 0:
		return fmt.Errorf("backoff: Min %v must be > 0", p.Min)
	case p.Max <= 0:
		return fmt.Errorf("backoff: Max %v must be > 0", p.Max)
	case !(p.Jitter >= 0 && p.Jitter <= 1): // also refuses NaN
		return fmt.Errorf("backoff: Jitter %v must be between 0 and 1", p.Jitter)
	}
	return nil
}

// Delay returns the wait before retry number attempt (1 for the first retry; less
// counts as 1), jittered from the process-wide random source, which is safe for
// concurrent use. It suits callbacks that are handed the attempt number, such as
// nats.CustomReconnectDelay; a loop keeps a [Backoff] instead.
func (p Policy) Delay(attempt int) time.Duration {
	return p.delay(attempt, rand.Int64N)
}

// Ceiling is the wait before retry number attempt without jitter: the longest Delay
// can return.
func (p Policy) Ceiling(attempt int) time.Duration {
	if p.Min <= 0 || p.Max <= 0 {
		return 0
	}
	d := p.Min
	for i := 1; i < attempt && d < p.Max; i++ {
		if d > p.Max/2 { // doubling would pass the cap (or overflow)
			d = p.Max
			break
		}
		d *= 2
	}
	return min(d, p.Max)
}

// delay is Delay with the random source given: int64n returns a uniform value in
// [0, n) for n > 0.
func (p Policy) delay(attempt int, int64n func(n int64) int64) time.Duration {
	d := p.Ceiling(attempt)
	jitter := min(max(p.Jitter, 0), 1)
	if span := int64(float64(d) * jitter); span > 0 {
		d -= time.Duration(int64n(span + 1))
	}
	return d
}

// Backoff is one retry loop's place in its Policy: Next returns the next wait, Reset
// starts again from Min after a success. A Backoff belongs to one goroutine.
type Backoff struct {
	policy   Policy
	int64n   func(n int64) int64
	failures int
}

// New returns a Backoff at the start of p, jittered from the process-wide random source.
func New(p Policy) *Backoff {
	return &Backoff{policy: p, int64n: rand.Int64N}
}

// NewWithSource is New with the jitter drawn from src, so that a test can predict every
// wait (rand.NewPCG with fixed seeds).
func NewWithSource(p Policy, src rand.Source) *Backoff {
	return &Backoff{policy: p, int64n: rand.New(src).Int64N}
}

// Next counts a failure and returns how long to wait before the next attempt: about
// Min after New or Reset, then about twice the previous ceiling, up to Max.
func (b *Backoff) Next() time.Duration {
	b.failures++
	return b.policy.delay(b.failures, b.int64n)
}

// Wait sleeps Next(); it returns false, early, when ctx ends first.
func (b *Backoff) Wait(ctx context.Context) bool {
	return Sleep(ctx, b.Next())
}

// Failures is how many times Next was called since New or the last Reset: 0 means the
// loop is not backing off, so a caller can log the first failure loudly and the
// recovery once.
func (b *Backoff) Failures() int { return b.failures }

// Reset starts the sequence again from Min; call it after an attempt succeeded.
func (b *Backoff) Reset() { b.failures = 0 }

// Sleep waits d, or returns false as soon as ctx ends. A d <= 0 does not wait; Sleep
// then reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
