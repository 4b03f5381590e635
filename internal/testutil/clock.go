package testutil

import "time"

// OffsetClock is the machine's clock moved by Offset: a machine whose clock an operator
// or NTP set back (negative) or forward. It is a snowflake.Clock (and a
// segment.Config.Now through its Now method). Sleep really sleeps.
type OffsetClock struct{ Offset time.Duration }

// Now returns the system time plus Offset.
func (c OffsetClock) Now() time.Time { return time.Now().Add(c.Offset) }

// Sleep waits d; d <= 0 returns at once.
func (c OffsetClock) Sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}
