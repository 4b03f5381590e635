package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// Monotonic serves the segment tags marked monotonic and keeps their marks (package
// monotonic's Manager). IsMonotonic is asked for every segment request, so it must
// cost no more than a map lookup; TryFill and Fill are SegmentSource's for those tags.
type Monotonic interface {
	// IsMonotonic reports whether tag is marked monotonic; an error (503 while the
	// marks load, 400 for a name that differs only in case from a marked tag) is the
	// answer to the request, unless the marks are loading and the Monotonic offers
	// Ready (monotonicLoader): then the request waits for them.
	IsMonotonic(tag string) (bool, error)
	TryFill(tag string, dst []int64) (ok bool, err error)
	Fill(ctx context.Context, tag string, dst []int64) error

	// SetMonotonic writes a tag's mark; MonotonicTags reads every mark from where they
	// are kept (not a cached view), for the admin subjects.
	SetMonotonic(ctx context.Context, tag string, on bool) error
	MonotonicTags(ctx context.Context) (map[string]bool, error)
}

// serveMonotonic serves a segment request of a monotonic tag, and reports mine=false
// for an ordinary tag, which the caller serves as before. It returns as serveIDs does:
// n IDs answered, or the error to answer, or 0 and nil when the request was handed to
// the Manager and is answered (and observed) when it calls back. A monotonic tag is
// never answered from a pool or the ordinary buffers: those are cut ahead of time.
func (s *Service) serveMonotonic(e *endpoint, m *nats.Msg, tag string, n int, enc wire.Encoding, start time.Duration) (mine bool, answered int, err error) {
	mono, err := s.cfg.Monotonic.IsMonotonic(tag)
	if err != nil {
		if loading := s.marksLoading(); loading != nil {
			return true, 0, s.waitForMarks(e, m, tag, n, enc, start, loading)
		}
		return true, 0, err
	}
	if !mono {
		return false, 0, nil
	}
	// Answered here, the IDs and the reply are the endpoint's scratch space, as for
	// any tag; a request that waits takes its own from the pool below.
	ids := e.scratchIDs(n)
	ok, err := s.cfg.Monotonic.TryFill(tag, ids)
	switch {
	case err != nil:
		return true, 0, err
	case ok:
		s.segStats.idsIssued.Add(uint64(n))
		s.reply(e, m.Subject, m.Reply, e.encode(ids, enc))
		return true, n, nil
	}
	// Forwarded to the leader, or waiting for the leader's next segment.
	if err := s.startSegmentWaiter(); err != nil {
		return true, 0, err
	}
	s.segStats.waited.Add(1)
	// The waiter slot makes Stop wait for the answer before closing.
	reply, subject := m.Reply, m.Subject
	p := s.getIDs(n)
	s.fillMonotonic(tag, *p, func(err error) {
		defer s.endWaiter()
		s.answerWaited(e, subject, reply, wire.Segment, &s.segStats, p, enc, start, err)
	})
	return true, 0, nil
}

// monotonicLoader is what a Monotonic may also offer (package monotonic's Manager
// does): Ready is closed once the marks are loaded.
type monotonicLoader interface {
	Ready() <-chan struct{}
}

// marksLoading is Monotonic's Ready while the marks are still loading, else nil (loaded,
// or nothing to wait for).
func (s *Service) marksLoading() <-chan struct{} {
	l, ok := s.cfg.Monotonic.(monotonicLoader)
	if !ok {
		return nil
	}
	select {
	case <-l.Ready():
		return nil
	default:
		return l.Ready()
	}
}

// waitForMarks answers a segment request that came while the marks load (a dispenser
// just started, under load) once they are in, off the delivery goroutine and within
// WaitMax, as a request for a tag not loaded yet is: no tag can be served before its
// mark is known, and a 503 at once would send a restarted dispenser's first requests
// back to its clients. It returns the error to answer at once, or nil.
func (s *Service) waitForMarks(e *endpoint, m *nats.Msg, tag string, n int, enc wire.Encoding, start time.Duration, loading <-chan struct{}) error {
	if err := s.startSegmentWaiter(); err != nil {
		return err
	}
	s.segStats.waited.Add(1)
	reply, subject := m.Reply, m.Subject
	p := s.getIDs(n)
	go func() {
		defer s.endWaiter()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WaitMax)
		defer cancel()
		var err error
		select {
		case <-loading:
			err = s.fillLoaded(ctx, tag, *p)
		case <-ctx.Done():
			err = fmt.Errorf("%w: the monotonic tag marks did not load within %v", wire.ErrUnavailable, s.cfg.WaitMax)
		}
		s.answerWaited(e, subject, reply, wire.Segment, &s.segStats, p, enc, start, err)
	}()
	return nil
}

// fillLoaded fills ids for a request that waited for the marks: from Monotonic for a
// monotonic tag, else from the segment buffers (a pool is only a shortcut).
func (s *Service) fillLoaded(ctx context.Context, tag string, ids []int64) error {
	mono, err := s.cfg.Monotonic.IsMonotonic(tag)
	switch {
	case err != nil:
		return err
	case mono:
		err = s.cfg.Monotonic.Fill(ctx, tag, ids)
	case s.cfg.Segments == nil:
		return fmt.Errorf("%w: segment IDs are not configured on this dispenser", wire.ErrUnavailable)
	default:
		err = s.cfg.Segments.Fill(ctx, tag, ids)
	}
	if err != nil && ctx.Err() != nil && !errors.Is(err, wire.ErrUnavailable) && !errors.Is(err, segment.ErrUnavailable) && !errors.Is(err, segment.ErrTagNotFound) {
		err = fmt.Errorf("%w: no IDs of %q within %v: %w", wire.ErrUnavailable, tag, s.cfg.WaitMax, err)
	}
	return err
}

// startSegmentWaiter is startWaiter for a segment request, counting a refusal for
// overload as every waiter does (refuseWaiter).
func (s *Service) startSegmentWaiter() error {
	if err := s.startWaiter(); err != nil {
		return s.refuseWaiter(&s.segStats, err, err)
	}
	return nil
}

// monotonicAsync is what a Monotonic may also offer (package monotonic's Manager
// does): FillAsync fills dst, which it owns until then, and calls done exactly once,
// at once or on another goroutine, within a bounded time. A request forwarded to the
// leader then holds no goroutine of its own.
type monotonicAsync interface {
	FillAsync(tag string, dst []int64, done func(error))
}

// fillMonotonic fills ids with FillAsync when Monotonic has it, else with Fill on a
// goroutine bounded by WaitMax, and calls done once either way.
func (s *Service) fillMonotonic(tag string, ids []int64, done func(error)) {
	if a, ok := s.cfg.Monotonic.(monotonicAsync); ok {
		a.FillAsync(tag, ids, done)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WaitMax)
		defer cancel()
		err := s.cfg.Monotonic.Fill(ctx, tag, ids)
		if err != nil && ctx.Err() != nil && !errors.Is(err, wire.ErrUnavailable) {
			err = fmt.Errorf("%w: no IDs of monotonic tag %q within %v: %w", wire.ErrUnavailable, tag, s.cfg.WaitMax, err)
		}
		done(err)
	}()
}

// errMonotonicOff answers an admin request that sets "monotonic" on a dispenser built
// without monotonic tags.
var errMonotonicOff = fmt.Errorf("%w: monotonic tags are not configured on this dispenser", wire.ErrUnavailable)

// markAdded writes the mark of a tag just added (false unless asked, so that a stale
// mark of an earlier tag of that name does not carry over) and shows it in info.
func (s *Service) markAdded(ctx context.Context, info *wire.TagInfo, want *bool) error {
	if s.cfg.Monotonic == nil {
		if want != nil && *want {
			return errMonotonicOff
		}
		return nil
	}
	on := want != nil && *want
	if err := s.cfg.Monotonic.SetMonotonic(ctx, info.Tag, on); err != nil {
		return fmt.Errorf("tag %q was added, but its monotonic mark was not written (retry with tags.update): %w", info.Tag, err)
	}
	info.Monotonic = on
	if on {
		s.logger.Info("tag marked monotonic", "tag", info.Tag)
	}
	return nil
}

// markUpdated writes the mark of an updated tag when want is set, and shows the mark in
// info either way.
func (s *Service) markUpdated(ctx context.Context, info *wire.TagInfo, want *bool) error {
	if s.cfg.Monotonic == nil {
		if want != nil {
			return errMonotonicOff
		}
		return nil
	}
	if want != nil {
		if err := s.cfg.Monotonic.SetMonotonic(ctx, info.Tag, *want); err != nil {
			return fmt.Errorf("update tag %q: %w", info.Tag, err)
		}
		info.Monotonic = *want
		s.logger.Info("tag monotonic mark updated", "tag", info.Tag, "monotonic", *want)
		return nil
	}
	marks, err := s.cfg.Monotonic.MonotonicTags(ctx)
	if err != nil {
		return fmt.Errorf("read the monotonic mark of tag %q: %w", info.Tag, err)
	}
	info.Monotonic = marks[info.Tag]
	return nil
}

// updateMark is an update that changes only a tag's mark.
func (s *Service) updateMark(ctx context.Context, name string, want *bool) (any, error) {
	t, err := s.findTag(ctx, name)
	if err != nil {
		return nil, err
	}
	info := tagInfo(t)
	if err := s.markUpdated(ctx, &info, want); err != nil {
		return nil, err
	}
	return info, nil
}

// monotonicMarks reads every mark for tags.list; nil without monotonic tags.
func (s *Service) monotonicMarks(ctx context.Context) (map[string]bool, error) {
	if s.cfg.Monotonic == nil {
		return nil, nil
	}
	marks, err := s.cfg.Monotonic.MonotonicTags(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tags: read the monotonic marks: %w", err)
	}
	return marks, nil
}

// findTag reads one tag for an update that changes only its mark: with the store's own
// Tag when it has one (segment.Store does, and knows whether names ignore case), else
// from the list.
func (s *Service) findTag(ctx context.Context, name string) (segment.Tag, error) {
	if g, ok := s.cfg.Tags.(interface {
		Tag(ctx context.Context, name string) (segment.Tag, error)
	}); ok {
		t, err := g.Tag(ctx, name)
		if err != nil {
			return segment.Tag{}, fmt.Errorf("update tag %q: %w", name, err)
		}
		return t, nil
	}
	tags, err := s.cfg.Tags.Tags(ctx)
	if err != nil {
		return segment.Tag{}, fmt.Errorf("update tag %q: %w", name, err)
	}
	for _, t := range tags {
		if t.Name == name {
			return t, nil
		}
	}
	return segment.Tag{}, fmt.Errorf("update tag %q: %w", name, segment.ErrTagNotFound)
}
