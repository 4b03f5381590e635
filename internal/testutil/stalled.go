package testutil

import "context"

// StalledSegments is a segment source (core.Config.Segments) that never has IDs in
// memory: Fill waits until Release is closed, then hands out 1, 2, ..., or until its
// context ends. It stands in for a store that stalls, to show what waits and what is
// refused while it does.
type StalledSegments struct{ Release chan struct{} }

// NewStalledSegments returns a StalledSegments whose Release is open.
func NewStalledSegments() *StalledSegments {
	return &StalledSegments{Release: make(chan struct{})}
}

// TryFill never fills: nothing is in memory.
func (s *StalledSegments) TryFill(string, []int64) (bool, error) { return false, nil }

// Fill waits for Release or ctx.
func (s *StalledSegments) Fill(ctx context.Context, _ string, dst []int64) error {
	select {
	case <-s.Release:
		for i := range dst {
			dst[i] = int64(i + 1)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
