package core

import (
	"context"
	"fmt"

	"github.com/leafbus/leafbus/wire"
)

// Ordinary is the source of every pre-filled segment batch (package pools: the
// in-memory replies and the JetStream pool stream): a tag's IDs from its buffers, given
// the tag's range by the Shaper, and never a monotonic tag's. A batch is cut ahead of
// time, so a pool must never hold IDs of a tag that promises order; this is the one
// place that says so, for the pools' fills and for the pool stream's purge (Excluded).
// A request of a monotonic tag never reaches a pool: Take routes it to the tag's leader
// first.
type Ordinary struct {
	segments SegmentFiller
	mono     monotonicTags // nil: no tag is monotonic
	shaper   *Shaper       // nil: every tag has the default range
}

// monotonicTags is the part of Monotonic that Ordinary asks.
type monotonicTags interface {
	IsMonotonic(tag string) (bool, error)
}

// NewOrdinary builds the pools' segment source over segments (the segment generator).
func NewOrdinary(segments SegmentFiller, mono monotonicTags, shaper *Shaper) *Ordinary {
	return &Ordinary{segments: segments, mono: mono, shaper: shaper}
}

// Excluded reports whether tag may not be pooled at all: it is monotonic. An error means
// it is not known yet (the marks are loading), and the pool waits.
func (o *Ordinary) Excluded(tag string) (bool, error) {
	if o.mono == nil {
		return false, nil
	}
	return o.mono.IsMonotonic(tag)
}

// Fill fills dst with the next IDs of tag, shaped to its range, or refuses a monotonic
// tag (503).
func (o *Ordinary) Fill(ctx context.Context, tag string, dst []int64) error {
	excluded, err := o.Excluded(tag)
	if err != nil {
		return err
	}
	if excluded {
		return fmt.Errorf("%w: tag %q is monotonic: no pre-filled batches", wire.ErrUnavailable, tag)
	}
	if err := o.segments.Fill(ctx, tag, dst); err != nil {
		return err
	}
	if o.shaper == nil {
		return nil
	}
	return o.shaper.Shape(tag, dst)
}
