package segment

import (
	"context"
	"errors"
	"time"
)

// Store is where number segments come from: Leaf's leaf_alloc table, one row per biz tag.
// Every method may be called from many goroutines, and by many dispensers sharing the
// store at once; Take must never hand the same range out twice, to anyone.
//
// Names that fail CheckTagName are refused with ErrInvalidTag before the store is asked.
// A tag is its stored bytes: a store that finds rows by a collation (MySQL) answers
// Take, Tag and UpdateTag of a name it takes for a row stored under another spelling
// with ErrTagSpelling (CheckSpelling), changing nothing.
type Store interface {
	// Take advances tag's max_id by step (by the tag's stored step when step is 0) in one
	// atomic operation and returns the tag as it is after the update. The segment it
	// grants is [MaxID - used step, MaxID), where the used step is step, or the returned
	// Tag.Step when step was 0. Returns ErrTagNotFound for an unknown tag, ErrInvalidTag
	// for a step outside 0..MaxStoredStep, and ErrMaxIDOverflow (writing nothing) when
	// max_id + step would not fit in an int64.
	Take(ctx context.Context, tag string, step int64) (Tag, error)

	// Tag returns one tag, or ErrTagNotFound.
	Tag(ctx context.Context, tag string) (Tag, error)

	// Tags returns every tag, sorted by name; an empty store gives an empty list and no
	// error.
	Tags(ctx context.Context) ([]Tag, error)

	// AddTag creates a tag (MaxID 0 means 1) and returns it as stored. Returns
	// ErrInvalidTag when Tag.Validate refuses it, ErrTagExists when the name is taken.
	AddTag(ctx context.Context, t Tag) (Tag, error)

	// UpdateTag changes a tag's step, description and/or max_id in one atomic operation
	// (ordered with every Take) and returns it as stored. Returns ErrTagNotFound for an
	// unknown tag, ErrInvalidTag for a value out of range or a max_id below the stored one
	// (changing nothing).
	UpdateTag(ctx context.Context, u TagUpdate) (Tag, error)
}

// Identifier is what a Store may also offer (the KV and MySQL stores do): Identity says
// which store it is, in one line that two dispensers of one deployment compare: "kv
// leaf_segments", or "mysql <server>/<database>" with the server's own name for itself
// (MySQL's @@server_uuid, or @@hostname:@@port where there is none, as on MariaDB).
// Two stores with the same identity hand out ranges of one leaf_alloc; two with
// different ones know nothing of each other's ranges.
type Identifier interface{ Identity() string }

// Tag is one row of leaf_alloc.
type Tag struct {
	Name        string
	MaxID       int64 // the next segment starts here
	Step        int64 // the default segment length, 1..MaxStoredStep
	Description string
	UpdateTime  time.Time
}

// TagUpdate names a tag and the fields to change; nil leaves a field as it is.
type TagUpdate struct {
	Name        string
	Step        *int64
	Description *string

	// MaxID moves the tag's max_id (where the next segment starts) up, never down: it is
	// how an operator repairs a store that went backwards (see ErrStoreWentBack), by
	// setting it to at least every dispenser's high-water mark. A value below the stored
	// max_id is refused with ErrInvalidTag; the stored value itself is accepted and
	// changes nothing.
	MaxID *int64
}

// ErrTagNotFound is returned when a biz tag has no row in the store.
var ErrTagNotFound = errors.New("tag not found")

// ErrTagExists is returned by AddTag when the tag already has a row.
var ErrTagExists = errors.New("tag already exists")

// ErrStoreDenied is returned when the segment store refuses an operation to the user the
// dispenser connects as: a MySQL privilege missing (Leaf's own grants, SELECT and UPDATE
// on leaf_alloc, do not let a dispenser add tags), or a password the server no longer
// takes. It is an operator's error, mended by a grant without a restart, not a bug, and
// it matches ErrUnavailable, so callers answer it as "not now" (503); the message names
// the privilege, the table, the user and the statement that grants it.
var ErrStoreDenied error = &storeDeniedError{}

// storeDeniedError is ErrStoreDenied: it matches ErrUnavailable without saying "segment
// IDs unavailable" in a message about adding a tag.
type storeDeniedError struct{}

func (*storeDeniedError) Error() string        { return "the segment store refuses this user" }
func (*storeDeniedError) Is(target error) bool { return target == ErrUnavailable }

// ErrMaxIDOverflow is returned by Take when advancing the tag's max_id by the step would
// pass the largest int64: the tag is used up, and wrapping to negative IDs is never an
// option.
var ErrMaxIDOverflow = errors.New("tag max_id would overflow int64")
