package snowflake_test

import (
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/snowflake"
)

// TestWaitsWithoutTheLock: a call that waits (for the next millisecond once the sequence
// is spent, or for a small backwards step of the clock to pass) does not hold the
// generator's lock while it sleeps. Its first sleep is held until the test releases it;
// meanwhile Issued and Stats answer and another Next gets its ID, which the sleeper's,
// taken afterwards, is above.
func TestWaitsWithoutTheLock(t *testing.T) {
	tests := []struct {
		name  string
		setUp func(g *snowflake.Generator, c *recClock)
	}{
		{"SequenceSpent", func(g *snowflake.Generator, _ *recClock) { fill(t, g, 4096) }},
		{"ClockBackwards", func(g *snowflake.Generator, c *recClock) { fill(t, g, 1); c.Add(-2 * time.Millisecond) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newRecClock(t0.Add(300 * time.Microsecond))
			g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true})
			tt.setUp(g, clock)
			sleeping, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			clock.onSleep = func(c *recClock, d time.Duration) {
				held := false
				once.Do(func() { held = true })
				if held {
					close(sleeping)
					<-release
				}
				c.FakeClock.Sleep(d)
			}
			type result struct {
				id  int64
				err error
			}
			first := make(chan result, 1)
			go func() {
				id, err := g.Next()
				first <- result{id, err}
			}()
			wait(t, sleeping, "the first Next to sleep")

			other := make(chan result, 1)
			go func() {
				g.Issued()
				g.Stats()
				id, err := g.Next()
				other <- result{id, err}
			}()
			var second result
			select {
			case second = <-other:
			case <-time.After(5 * time.Second):
				t.Fatalf("Issued, Stats and Next were blocked for 5s by a Next sleeping: the lock is held while sleeping")
			}
			close(release)
			var r result
			select {
			case r = <-first:
			case <-time.After(5 * time.Second):
				t.Fatalf("the sleeping Next did not return within 5s of its release")
			}
			if r.err != nil || second.err != nil {
				t.Fatalf("Next errors: sleeper %v, other %v", r.err, second.err)
			}
			if r.id <= second.id {
				t.Fatalf("sleeper's ID %d taken after the other's %d is not above it", r.id, second.id)
			}
		})
	}
}

// wait fails tb unless ch closes within 5s.
func wait(tb testing.TB, ch <-chan struct{}, what string) {
	tb.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		tb.Fatalf("waited 5s for %s", what)
	}
}
