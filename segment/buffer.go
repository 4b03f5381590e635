package segment

import (
	"sync"
	"sync/atomic"
	"time"
)

// buffer is one tag's double buffer (Leaf's SegmentBuffer). Readers only touch cur and
// the segment it points to; everything else changes under mu on the rare paths: a load
// finishing, a switch to the next segment, a refresh.
type buffer struct {
	name string
	cur  atomic.Pointer[segment] // nil until the first load

	mu       sync.Mutex
	next     *segment // loaded and waiting for cur to be spent
	loading  bool     // a loader goroutine owns the next load
	loaded   bool     // a load succeeded: step, minStep and lastLoad are set
	resident bool     // in Generator.tags; false while a first lookup is pending
	dropped  bool     // out of Generator.tags and pending: loads stop, requests look up again
	notFound bool     // the store said the tag does not exist
	wentBack bool     // the last load found the store below the tag's mark: err says so, requests get it at once
	gen      uint64   // refresh generation in which a lookup made it resident
	waiters  int      // Fill calls waiting on changed
	step     int64    // the step of the last load (Leaf's dynamic step)
	minStep  int64    // the stored step: the dynamic step never goes below it
	lastLoad time.Time
	err      error         // why the last load failed; nil after a success
	changed  chan struct{} // closed at each state change; made only when someone waits

	// Monitoring (TagStats), counted by the loads, never by requests: segments installed,
	// failed store calls, and the IDs of every segment installed.
	loads, loadErrors uint64
	loadedIDs         int64
	loadNanos         atomic.Int64 // time spent in store calls of loads
}

// signal wakes every Fill waiting on b. Called with mu held.
func (b *buffer) signal() {
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}

// waitChan returns the channel the next signal closes. Called with mu held.
func (b *buffer) waitChan() <-chan struct{} {
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	return b.changed
}

// segment is the range [start, start+size) of one load. pos counts the IDs asked of it;
// it only grows, and may grow past size (those asks got nothing here and moved on), so
// each ID is handed to exactly the one caller whose add covered its offset.
//
// It is 64 bytes, one cache line (Go aligns 64-byte objects to 64): the add on pos of a
// busy tag does not slow the tags whose segments sit beside it.
type segment struct {
	pos     atomic.Int64
	start   int64 // the first ID, >= 1
	size    int64 // how many IDs; 0 for a load that clipped to nothing
	trigger int64 // once pos passes it (10% used), the next segment is loaded
	_       [32]byte
}

// newSegment makes the segment [maxID-step, maxID) of a load, clipped so that it never
// holds an ID below 1 (a hand-inserted max_id of 0, or a max_id smaller than its step).
func newSegment(maxID, step int64) *segment {
	start, end := int64(1), int64(1)
	if maxID > 1 {
		start, end = max(maxID-step, 1), maxID
	}
	size := end - start
	return &segment{start: start, size: size, trigger: size / 10}
}

func (s *segment) spent() bool { return s.pos.Load() >= s.size }

// nextStep is Leaf's dynamic step: double it while a segment lasts less than target
// (unless that would pass maxStep), keep it up to twice target, halve it beyond (unless
// that would go below minStep). A stored step raised by an admin is a floor at once.
func nextStep(step, minStep int64, lasted, target time.Duration, maxStep int64) int64 {
	switch {
	case lasted < target:
		if step*2 <= maxStep {
			step *= 2
		}
	case lasted < 2*target:
	default:
		if step/2 >= minStep {
			step /= 2
		}
	}
	return max(step, minStep)
}
