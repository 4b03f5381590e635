package segment

import (
	"cmp"
	"slices"
	"time"
)

// TagStats is one tag's double buffer at one moment, as Leaf's /cache page shows its
// SegmentBuffer: for /metrics and the status page. Every figure comes from the loads;
// requests count nothing here, so the hot path stays one atomic add.
type TagStats struct {
	Tag string
	// Current is the segment IDs are handed out from, Next the one loaded ahead (zero
	// while none is: NextReady false). Both are zero before the tag's first load.
	Current, Next Window
	NextReady     bool
	// Step is the step of the last load (Leaf's dynamic step).
	Step int64
	// Issued counts the IDs taken from the tag's segments since start: handed out, or
	// skipped as a gap when a batch ran past a segment's end.
	Issued uint64
	// Loads counts segments installed; LoadErrors failed store calls of loads (each is
	// retried); LoadTime is the time spent in the store calls of both.
	Loads, LoadErrors uint64
	LoadTime          time.Duration
	// LastLoad is when the last segment arrived (zero before the first); LastError why
	// the last load failed, "" once a load succeeded again.
	LastLoad  time.Time
	LastError string
}

// Window is one segment of a buffer in Leaf's terms (its Segment's value, max and step):
// Value is the next ID to hand out, Max one past the last, Step how many IDs it holds.
type Window struct {
	Value, Max, Step int64
}

// TagStats returns every resident tag's buffer, sorted by tag. It takes each buffer's
// lock briefly, one at a time, so it may run beside serving; tags being looked up for a
// request are left out until their first load.
func (g *Generator) TagStats() []TagStats {
	tags := *g.tags.Load()
	out := make([]TagStats, 0, len(tags))
	for _, b := range tags {
		out = append(out, b.stats())
	}
	slices.SortFunc(out, func(a, b TagStats) int { return cmp.Compare(a.Tag, b.Tag) })
	return out
}

// stats reads b's figures under mu, which every switch of segments holds too, so the
// current and next segment belong together; positions move on meanwhile (atomically).
func (b *buffer) stats() TagStats {
	b.mu.Lock()
	s := TagStats{
		Tag: b.name, Step: b.step, Loads: b.loads, LoadErrors: b.loadErrors,
		LastLoad: b.lastLoad, NextReady: b.next != nil,
	}
	if b.err != nil {
		s.LastError = b.err.Error()
	}
	s.Current, s.Next = b.cur.Load().windowOf(), b.next.windowOf()
	loaded := b.loadedIDs
	b.mu.Unlock()
	s.LoadTime = time.Duration(b.loadNanos.Load())
	left := (s.Current.Max - s.Current.Value) + (s.Next.Max - s.Next.Value)
	s.Issued = uint64(max(loaded-left, 0))
	return s
}

// windowOf is the segment as a Window; zero for nil.
func (s *segment) windowOf() Window {
	if s == nil {
		return Window{}
	}
	end := s.start + s.size
	return Window{Value: s.start + min(s.pos.Load(), s.size), Max: end, Step: s.size}
}
