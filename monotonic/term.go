package monotonic

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// term is one lease a leader took on one tag, from the write that took it until it
// lapsed, was lost, or was released. Times are on the Manager's clock.
type term struct {
	subject string // the inbox followers forward to
	record  []byte // the lease record, as written at each renewal
	rev     uint64 // the lease key's revision this leader wrote last; the campaign's
	// serveFrom is when the term may start serving (see the package doc); unset (the
	// largest value) until the lease write returned, while followers may already
	// forward to the subject.
	serveFrom atomic.Int64
	// fenceFrom is when the lease rules let the term serve; serveFrom is later while
	// the tag settles, and drops to fenceFrom (or now) once it settled early.
	fenceFrom time.Duration
	// validUntil is half a lease TTL after the send of the last renewal that succeeded.
	// It only grows while the term lives, and drops to 0 when it ends; once the clock
	// reached it, the term is over for good, whatever a late renewal says.
	validUntil atomic.Int64
	seq        *sequence
	sub        *nats.Subscription
	stopLoader context.CancelFunc
	served     atomic.Uint64 // requests answered from this term
}

// serving reports whether the term may hand out IDs at now.
func (t *term) serving(now time.Duration) bool {
	return int64(now) >= t.serveFrom.Load() && int64(now) < t.validUntil.Load()
}

// startsAt is when the term may start serving.
func (t *term) startsAt() time.Duration { return time.Duration(t.serveFrom.Load()) }

// extend moves the term's validity to until after a renewal, unless it lapsed before
// now; it reports whether the term still lives.
func (t *term) extend(now, until time.Duration) bool {
	for {
		cur := t.validUntil.Load()
		switch {
		case int64(now) >= cur:
			return false
		case int64(until) <= cur:
			return true
		case t.validUntil.CompareAndSwap(cur, int64(until)):
			return true
		}
	}
}

// end stops the term at once: no request is served from it again, no segment joins it.
func (t *term) end() {
	t.validUntil.Store(0)
	t.seq.close()
	if t.stopLoader != nil {
		t.stopLoader()
	}
	if t.sub != nil {
		// Drain, not Unsubscribe: forwarded requests already delivered are answered (a
		// 503 now) instead of being dropped to time out at the follower.
		_ = t.sub.Drain()
	}
}

// errNotServing is returned when a request reaches a term that does not serve (yet, or
// any more).
var errNotServing = fmt.Errorf("%w: monotonic: this dispenser does not hold a valid lease on the tag", wire.ErrUnavailable)

// fillTerm fills dst from t's sequence, in order, waiting for the next segment at most
// until ctx ends. The lease is checked once, here, after the request arrived: a request
// that passes was sent before any later leader could serve (package doc), so the IDs it
// takes may be handed out after that without breaking the promise.
func (m *Manager) fillTerm(ctx context.Context, ts *tagState, t *term, dst []int64) error {
	if !t.serving(m.now()) {
		return errNotServing
	}
	n := 0
	for {
		k, wait, err := t.seq.take(dst[n:], false)
		n += k
		if err != nil {
			return fmt.Errorf("monotonic: tag %q: %w", ts.name, err)
		}
		if n == len(dst) {
			t.served.Add(1)
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			cause := t.seq.lastErr()
			if cause == nil {
				cause = ctx.Err()
			}
			return fmt.Errorf("%w: monotonic: tag %q: no segment from the store in time: %w", wire.ErrUnavailable, ts.name, cause)
		}
	}
}

// loadTimeout bounds one store call of a leader's loader.
const loadTimeout = 5 * time.Second

// loadPolicy is the back-off of a loader whose store calls fail.
var loadPolicy = backoff.Policy{Min: 20 * time.Millisecond, Max: time.Second, Jitter: 0.5}

// load keeps t's sequence supplied: a segment to serve and one ahead. Its first store
// call waits for serveFrom, so that every segment it takes is taken after the previous
// leader could serve. A segment joins the sequence only if its store call returned
// while the lease was valid: then the store granted it before any later leader's first
// segment, which is therefore above it.
func (m *Manager) load(ctx context.Context, ts *tagState, t *term) {
	if ts.settleUntil > t.fenceFrom && m.now() < ts.settleUntil && m.settledEarly(ctx, ts) {
		t.serveFrom.Store(int64(max(t.fenceFrom, m.now())))
		ts.changed.fire()
	}
	if !m.sleepUntil(ctx, t.startsAt()) {
		return
	}
	var step, stored int64
	var last time.Duration
	bo := backoff.New(loadPolicy)
	for ctx.Err() == nil {
		if !t.seq.wantsLoad() {
			select {
			case <-t.seq.wake:
			case <-ctx.Done():
			}
			continue
		}
		if step != 0 {
			step = segment.NextStep(step, stored, m.now()-last, m.cfg.SegmentDuration, m.cfg.MaxStep)
		}
		callCtx, cancel := context.WithTimeout(ctx, loadTimeout)
		r, err := m.cfg.Segments.TakeSegment(callCtx, ts.name, step)
		cancel()
		if err == nil {
			var ok bool
			if ok, err = t.seq.install(r, func() bool { return t.serving(m.now()) }); err == nil && !ok {
				return // the term is over; the range is a gap
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t.seq.failed(err)
			wait := bo.Next()
			if bo.Failures() == 1 || errors.Is(err, segment.ErrStoreWentBack) {
				m.log.Warn("monotonic: leader cannot take a segment, retrying", "tag", ts.name, "err", err, "retry_in", wait)
			}
			backoff.Sleep(ctx, wait)
			continue
		}
		bo.Reset()
		step, stored, last = r.Step, r.StoredStep, m.now()
	}
}

// sleepUntil waits until the clock reaches at, or ctx ends (false).
func (m *Manager) sleepUntil(ctx context.Context, at time.Duration) bool {
	for {
		d := at - m.now()
		if d <= 0 {
			return true
		}
		if !backoff.Sleep(ctx, d) {
			return false
		}
	}
}
