package segment

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/leafbus/leafbus/wire"
)

// MaxStoredStep is the largest step a tag may store (PROTOCOL: step is 1 to 10,000,000).
// The dynamic step never asks the store for more than max(Config.MaxStep, stored step).
const MaxStoredStep = 10_000_000

// Bounds from the wire contract and Leaf's leaf_alloc columns.
const (
	maxDescription = 256 // description varchar(256), counted in characters as MySQL does
)

// ErrInvalidTag is returned when a tag name, or a tag's step, max_id or description, is
// outside what the protocol and leaf_alloc allow. The message names the value.
var ErrInvalidTag = errors.New("invalid tag")

// ErrTagSpelling is returned when a tag is asked for by a spelling that its store
// takes for a row stored under another one: MySQL's biz_tag compares by the table's
// collation, which may equate "tİny", "TINY", "tíny" or "tiny " with the row "tiny".
// Such a spelling is refused, never served: every rule keyed by a tag (its range,
// width and key, its monotonic mark, its high-water mark, its pool, its metrics) knows
// it by its stored bytes, so a second spelling would be served past them. The error
// matches ErrInvalidTag too (a 400), and its message names the stored tag.
var ErrTagSpelling = errors.New("tag stored under another spelling")

// spellingError is ErrTagSpelling for one spelling and its stored tag.
type spellingError struct{ asked, stored string }

func (e *spellingError) Error() string {
	return fmt.Sprintf("tag %s is stored as %s: ask for %s", wire.Quote(e.asked), wire.Quote(e.stored), wire.Quote(e.stored))
}

func (e *spellingError) Is(target error) bool {
	return target == ErrTagSpelling || target == ErrInvalidTag
}

// CheckSpelling returns nil when the tag asked for is byte for byte the tag stored,
// and an error matching ErrTagSpelling and ErrInvalidTag that names the stored tag
// otherwise. Stores that compare by a collation call it on every row they find by a
// name, and the generator on every tag it looks up, before anything is keyed by it.
func CheckSpelling(asked, stored string) error {
	if asked == stored {
		return nil
	}
	return &spellingError{asked: asked, stored: stored}
}

// CheckTagName returns nil when name is a valid tag (wire.CheckTag: 1 to 128 characters
// of A-Z a-z 0-9 _ -), and an error wrapping ErrInvalidTag that names the value
// otherwise. It allocates nothing on success, so the request path can call it freely.
func CheckTagName(name string) error {
	if err := wire.CheckTag(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTag, err)
	}
	return nil
}

// Validate checks a tag as AddTag stores it: a valid name, Step 1..MaxStoredStep,
// MaxID >= 1 and a description of at most 256 characters. Errors wrap ErrInvalidTag.
func (t Tag) Validate() error {
	if err := CheckTagName(t.Name); err != nil {
		return err
	}
	if err := checkStoredStep(t.Name, t.Step); err != nil {
		return err
	}
	if t.MaxID < 1 {
		return fmt.Errorf("%w: tag %q: max_id %d must be at least 1", ErrInvalidTag, t.Name, t.MaxID)
	}
	return checkDescription(t.Name, t.Description)
}

// Validate checks the fields a TagUpdate would change; errors wrap ErrInvalidTag.
func (u TagUpdate) Validate() error {
	if err := CheckTagName(u.Name); err != nil {
		return err
	}
	if u.Step != nil {
		if err := checkStoredStep(u.Name, *u.Step); err != nil {
			return err
		}
	}
	if u.MaxID != nil && *u.MaxID < 1 {
		return fmt.Errorf("%w: tag %q: max_id %d must be at least 1", ErrInvalidTag, u.Name, *u.MaxID)
	}
	if u.Description != nil {
		return checkDescription(u.Name, *u.Description)
	}
	return nil
}

// apply returns t with the update's fields changed, or an error wrapping ErrInvalidTag
// (and nothing changed) when the update would lower t's max_id.
func (u TagUpdate) apply(t Tag) (Tag, error) {
	if u.MaxID != nil {
		if err := checkRaise(u.Name, t.MaxID, *u.MaxID); err != nil {
			return t, err
		}
		t.MaxID = *u.MaxID
	}
	if u.Step != nil {
		t.Step = *u.Step
	}
	if u.Description != nil {
		t.Description = *u.Description
	}
	return t, nil
}

// checkRaise refuses to move a tag's max_id from current down to want: every ID below
// current may have been handed out already, and lowering max_id would hand it out
// again. Equal is allowed, so that repeating a repair is harmless.
func checkRaise(name string, current, want int64) error {
	if want < current {
		return fmt.Errorf("%w: tag %q: max_id %d is below the stored max_id %d; max_id only moves up, since every ID below it may already have been handed out", ErrInvalidTag, name, want, current)
	}
	return nil
}

func checkStoredStep(name string, step int64) error {
	if step < 1 || step > MaxStoredStep {
		return fmt.Errorf("%w: tag %q: step %d must be between 1 and %d", ErrInvalidTag, name, step, MaxStoredStep)
	}
	return nil
}

func checkDescription(name, d string) error {
	if n := utf8.RuneCountInString(d); n > maxDescription {
		return fmt.Errorf("%w: tag %q: description of %d characters is longer than %d", ErrInvalidTag, name, n, maxDescription)
	}
	return nil
}

// checkTake validates Take's arguments, the same way in every store.
func checkTake(name string, step int64) error {
	if err := CheckTagName(name); err != nil {
		return err
	}
	if step < 0 || step > MaxStoredStep {
		return fmt.Errorf("%w: tag %q: step %d must be between 0 (the stored step) and %d", ErrInvalidTag, name, step, MaxStoredStep)
	}
	return nil
}

// advance returns t with MaxID moved past one segment of step (t.Step when step is 0),
// or ErrMaxIDOverflow. Shared by the stores that compute the new row themselves.
func advance(t Tag, step int64) (Tag, error) {
	if step == 0 {
		step = t.Step
	}
	if step < 1 {
		// A broken row, not a bad request: no ErrInvalidTag, or callers would answer 400.
		return t, fmt.Errorf("tag %q: stored step %d is not positive", t.Name, step)
	}
	if t.MaxID > maxInt64-step {
		return t, fmt.Errorf("tag %q: max_id %d + step %d: %w", t.Name, t.MaxID, step, ErrMaxIDOverflow)
	}
	t.MaxID += step
	return t, nil
}

const maxInt64 = 1<<63 - 1
