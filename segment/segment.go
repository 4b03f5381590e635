// Package segment hands out Leaf-segment IDs: per biz tag, number ranges taken from a
// Store (Leaf's leaf_alloc table in MySQL, or a JetStream KV bucket) and served from
// memory through a double buffer. It is Leaf's SegmentIDGenImpl and SegmentBuffer in Go.
//
// Each tag has a current segment and, once 10% of it is used, a next one loaded in the
// background, so a request normally costs one atomic add and no I/O. The segment length
// (step) adapts as in Leaf: it doubles while segments last less than SegmentDuration and
// halves, never below the stored step, when they last more than twice that. No segment
// is kept across restarts: every Generator takes fresh ranges from the store, so a
// restart leaves a gap and never repeats an ID.
//
// What a node does keep, when Config.Marks is set, is its high-water mark per tag: the
// highest max_id it ever took, written to a file before the segment is served. A store
// that goes backwards (a rewound row, a leaf_alloc restored from a backup, a lost KV
// bucket) would otherwise hand the same IDs out again; with marks, such a segment is
// refused (ErrStoreWentBack, a 503) until an operator raises the tag's max_id
// (TagUpdate.MaxID), and CheckStoreAgainstMarks finds it before a dispenser starts.
//
// Unlike Leaf, a request never blocks another tag, a spent tag waits at most
// Config.WaitMax and then fails with ErrUnavailable, and IDs are always positive.
package segment

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ErrUnavailable is returned when IDs (or a store write) cannot be had safely right now:
// the generator is starting (its first tag list has not loaded) or stopped, a tag's both
// segments are spent and the store did not deliver the next one within WaitMax, or a
// store gave up on a contended update. The error also wraps the cause when there is one.
var ErrUnavailable = errors.New("segment IDs unavailable")

// ErrStoreWentBack is returned when the store granted a segment of a tag that starts
// below this node's high-water mark for it (Config.Marks), or, at start-up, by
// CheckStoreAgainstMarks for a store that lost or rewound tags. The store went
// backwards (a rewound row, a leaf_alloc restored from a backup, a lost KV bucket), so
// the segment may hold IDs this node already handed out and is never served: the tag
// answers this error until an operator moves its max_id above the mark (`dispenser tag
// update --tag T --max-id N`, see TagUpdate.MaxID); other tags are not affected. It
// also matches ErrUnavailable, so that callers answer it as "cannot dispense safely
// right now" (503); the message names the tag, the segment and the mark.
var ErrStoreWentBack = fmt.Errorf("segment store went backwards: %w", ErrUnavailable)

// Config configures a Generator. Start from DefaultConfig and set Store.
type Config struct {
	// Store is where segments come from. Required.
	Store Store

	// Now is the clock of the dynamic step (how long a segment lasted). nil: time.Now.
	// Waits and retries use real timers whatever Now says.
	Now func() time.Time

	// RefreshInterval is how often the tag list is reloaded from the store: new tags get
	// a buffer, deleted ones are dropped, and changed stored steps become the new
	// minimum step. A tag asked for in between is looked up at once. Leaf: 60s.
	RefreshInterval time.Duration

	// SegmentDuration is the dynamic step's target lifetime of one segment: a segment
	// used up faster doubles the step of the next load, one lasting more than twice as
	// long halves it. Leaf: 15m.
	SegmentDuration time.Duration

	// MaxStep bounds the doubling: a step is only doubled while the result stays at or
	// below MaxStep (a stored step above it is still used as it is). Leaf: 1,000,000.
	// 1..MaxStoredStep.
	MaxStep int64

	// WaitMax is how long Fill waits, when a tag's both segments are spent (or a tag is
	// being looked up), for the store to deliver, before it fails with ErrUnavailable.
	// Default 1s: a load takes milliseconds (KV compare-and-set about 10 ms, MySQL less),
	// so 1s covers a slow load plus several retries; it stays below the 2-5 s clients
	// usually give a NATS request, so a client gets a 503 it can act on (retry, perhaps
	// on another dispenser) rather than a time-out; and it bounds how many requests
	// pile up waiting on one stuck tag.
	WaitMax time.Duration

	// LoadTimeout bounds one store call of a background load or lookup, so that a
	// store that hangs (a network partition) is retried instead of stalling a tag for
	// good. Default 5s.
	LoadTimeout time.Duration

	// Marks, when set, holds this node's high-water mark per tag (see Marks; the
	// dispenser keeps them in a FileMarks in its data directory). Every segment from
	// the store is checked against the tag's mark, and its end recorded durably before
	// any of its IDs is served. A segment starting below the mark, from a store that
	// went backwards, is never served: the tag answers ErrStoreWentBack, other tags go
	// on, and once an operator raises the tag's max_id to the mark or above, the next
	// load (within 5s) serves again, with no restart. nil: no marks, and a store that
	// goes backwards repeats IDs.
	Marks Marks

	// Logger receives load failures, refreshes and dropped tags. nil: discard.
	Logger *slog.Logger
}

// DefaultConfig returns Leaf's settings; Store is left for the caller to set.
func DefaultConfig() Config {
	return Config{
		RefreshInterval: 60 * time.Second,
		SegmentDuration: 15 * time.Minute,
		MaxStep:         1_000_000,
		WaitMax:         time.Second,
		LoadTimeout:     5 * time.Second,
	}
}

// Validate reports the first setting that is missing or out of range, naming the field,
// its value and the bound.
func (c Config) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("segment: config: Store is nil")
	case c.RefreshInterval < time.Millisecond:
		return fmt.Errorf("segment: config: RefreshInterval %v must be at least 1ms", c.RefreshInterval)
	case c.SegmentDuration < time.Millisecond:
		return fmt.Errorf("segment: config: SegmentDuration %v must be at least 1ms", c.SegmentDuration)
	case c.MaxStep < 1 || c.MaxStep > MaxStoredStep:
		return fmt.Errorf("segment: config: MaxStep %d must be between 1 and %d", c.MaxStep, MaxStoredStep)
	case c.WaitMax < time.Millisecond:
		return fmt.Errorf("segment: config: WaitMax %v must be at least 1ms", c.WaitMax)
	case c.LoadTimeout < time.Millisecond:
		return fmt.Errorf("segment: config: LoadTimeout %v must be at least 1ms", c.LoadTimeout)
	}
	return nil
}
