package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/wire"
)

// Record is the deployment record as the admin calls keep it (package deployment's,
// bound to this dispenser): where a tag's monotonic mark and range are written beside
// their own home, so that a dispenser that lost both still learns them. nil: no record.
type Record interface {
	SetMonotonic(ctx context.Context, tag string, on bool) error
	SetRange(ctx context.Context, tag string, r wire.TagRange) error
}

// rangesServable is what TagRanges may also offer (package monotonic's Manager does):
// nil when every dispenser of the deployment can serve r (knows tag ranges and, for an
// opaque r, holds its key).
type rangesServable interface {
	CanServeRange(ctx context.Context, r wire.TagRange) error
}

// setMonotonic writes tag's mark and the record, in the order that never leaves a mark
// the record lacks: a mark is written first and recorded after; an unmark is recorded
// first and written after.
func (c *Core) setMonotonic(ctx context.Context, tag string, on bool) error {
	if on {
		if err := c.cfg.Monotonic.SetMonotonic(ctx, tag, true); err != nil {
			return err
		}
		return c.recordMark(ctx, tag, true)
	}
	if err := c.recordMark(ctx, tag, false); err != nil {
		return err
	}
	return c.cfg.Monotonic.SetMonotonic(ctx, tag, false)
}

func (c *Core) recordMark(ctx context.Context, tag string, on bool) error {
	if c.cfg.Record == nil {
		return nil
	}
	if err := c.cfg.Record.SetMonotonic(ctx, tag, on); err != nil {
		return fmt.Errorf("%w: tag %q: the deployment record's monotonic tags were not updated (retry): %w", wire.ErrUnavailable, tag, err)
	}
	return nil
}

// setRange writes tag's range to the record first, then to its home (which returns once
// every dispenser serves it): the record is how a dispenser that remembers nothing
// learns the range of an opaque tag whose value was lost, so it must never lack one that
// is served. Nothing is written while a dispenser cannot serve the range (knows no ranges,
// or lacks an opaque range's key).
func (c *Core) setRange(ctx context.Context, tag string, r wire.TagRange) error {
	if k, ok := c.cfg.TagRanges.(rangesServable); ok {
		if err := k.CanServeRange(ctx, r); err != nil {
			return err
		}
	}
	if c.cfg.Record != nil {
		err := c.cfg.Record.SetRange(ctx, tag, r)
		switch {
		case errors.Is(err, deployment.ErrRangeFixed):
			return fmt.Errorf("%w: %w", wire.ErrConflict, err)
		case err != nil:
			return fmt.Errorf("%w: tag %q: the deployment record's tag ranges were not updated (retry): %w", wire.ErrUnavailable, tag, err)
		}
	}
	return c.cfg.TagRanges.SetRange(ctx, tag, r)
}
