package dispenser

import (
	"context"
	"fmt"
	"time"
)

// epochWarnLeft: with less than this left before the layout's last timestamp, the start
// logs a warning; past it, the start fails.
const epochWarnLeft = 365 * 24 * time.Hour

// checkEpoch refuses an epoch the clock has not reached, and one so far back that the
// clock is already past the last timestamp its time bits hold. Config.Validate can only
// see that the epoch fits an int64; against the clock, a future epoch used to start a
// dispenser whose every snowflake request was refused (the generator will not issue a
// timestamp before the epoch) with nothing said at start, and an exhausted one would be
// refused the same way (ErrTimestampOverflow).
func (d *Dispenser) checkEpoch(context.Context) error {
	l := d.cfg.Layout()
	now := d.clock.Now()
	epoch, last := time.UnixMilli(l.Epoch).UTC(), time.UnixMilli(l.MaxTimestamp()).UTC()
	switch {
	case now.UnixMilli() <= l.Epoch:
		return fmt.Errorf("--epoch %d (%s) is in the future (the clock reads %s): keep the epoch your IDs were made with, Leaf's is %d (docs/errors.md#epoch-in-future)",
			l.Epoch, epoch.Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano), DefaultConfig().Epoch)
	case now.UnixMilli() >= l.MaxTimestamp():
		return fmt.Errorf("--epoch %d (%s) leaves no room: %d time bits end at %s, and the clock reads %s",
			l.Epoch, epoch.Format(time.RFC3339Nano), l.TimeBits, last.Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
	case last.Sub(now) < epochWarnLeft:
		d.log.Warn("snowflake IDs run out within a year: the time bits of --epoch end soon", "epoch", l.Epoch, "last", last, "left", last.Sub(now).Round(time.Hour))
	}
	return nil
}
