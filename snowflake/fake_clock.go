package snowflake

import (
	"sync"
	"time"
)

// FakeClock is a [Clock] for tests: it stands still until told to move. Sleep advances it by
// the duration asked, so a generator that waits for the next millisecond gets there at once.
// It is safe for concurrent use.
type FakeClock struct {
	mu    sync.Mutex
	now   time.Time
	slept time.Duration
}

var _ Clock = (*FakeClock)(nil)

// NewFakeClock returns a FakeClock reading t.
func NewFakeClock(t time.Time) *FakeClock { return &FakeClock{now: t} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep advances the clock by d (nothing for d <= 0) and adds d to Slept.
func (c *FakeClock) Sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.slept += d
}

// Set moves the clock to t, backwards or forwards, as an NTP step would.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Add moves the clock by d (backwards when d < 0) without counting it as sleep.
func (c *FakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Slept returns the total of all Sleep calls so far, so a test can tell how long the code
// under test waited.
func (c *FakeClock) Slept() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slept
}
