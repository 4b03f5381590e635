package segment

import (
	"context"
	"fmt"
	"time"
)

// Range is one segment of a tag's IDs, [First, End), taken by TakeSegment.
type Range struct {
	First, End int64
	Step       int64 // the step the store advanced max_id by
	StoredStep int64 // the tag's stored step: the floor of a dynamic step
}

// TakeSegment takes one new segment of tag straight from the store, past the tag's
// buffers, for a caller that serves the tag from an in-order sequence of its own
// (package monotonic): a segment a buffer loaded earlier lies below everything taken
// since, so serving from it after a newer range would go backwards. The segment is
// checked against the tag's high-water mark and the mark raised durably before it is
// returned, exactly as for a buffer's load (Config.Marks). step 0 takes the stored
// step. It needs no Run and may be called from any goroutine.
//
// Errors: ErrInvalidTag, ErrTagNotFound, ErrStoreWentBack (a 503 until an operator
// repairs the store), ErrMaxIDOverflow, and the store's own.
func (g *Generator) TakeSegment(ctx context.Context, tag string, step int64) (Range, error) {
	if err := CheckTagName(tag); err != nil {
		return Range{}, err
	}
	seg, used, stored, err := g.takeChecked(ctx, tag, step)
	if err != nil {
		return Range{}, err
	}
	return Range{First: seg.start, End: seg.start + seg.size, Step: used, StoredStep: stored}, nil
}

// takeChecked takes one segment of name from the store (step 0: the stored step) and
// passes it through the marks check, which records its end durably. It returns the
// segment, the step used and the tag's stored step. A tag whose store was found behind
// its mark is read again first, so that no segment is taken while it still is. Takes
// of one row wait for each other, from the take to the recorded mark (rowLocks).
func (g *Generator) takeChecked(ctx context.Context, name string, step int64) (*segment, int64, int64, error) {
	unlock, err := g.rows.lock(ctx, name)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("segment: tag %q: wait for another take of its row: %w", name, err)
	}
	defer unlock()
	if g.isBehind(name) {
		if err := g.recheckStore(ctx, name); err != nil {
			return nil, 0, 0, err
		}
	}
	t, err := g.cfg.Store.Take(ctx, name, step)
	if err != nil {
		return nil, 0, 0, err
	}
	used := step
	if used == 0 {
		used = t.Step
	}
	if used < 1 || used > MaxStoredStep {
		return nil, 0, 0, fmt.Errorf("segment: tag %q: store granted a segment of step %d", name, used)
	}
	seg := newSegment(t.MaxID, used)
	if err := g.guard(name, t.Name, seg); err != nil {
		return nil, 0, 0, err
	}
	return seg, used, t.Step, nil
}

// NextStep is Leaf's dynamic step, as the buffers use it: the step of the next load
// after a segment of step lasted lasted, for a target lifetime target, never below
// minStep (the stored step) and doubled only up to maxStep.
func NextStep(step, minStep int64, lasted, target time.Duration, maxStep int64) int64 {
	return nextStep(step, minStep, lasted, target, maxStep)
}
