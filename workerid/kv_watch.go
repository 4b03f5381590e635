package workerid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// How a KV lease's watch recovers.
const (
	// kvWatchRetryMin and kvWatchRetryMax bound the wait before a broken watch is set up
	// again (doubling in between); the NATS connection coming back sets it up at once.
	kvWatchRetryMin = 50 * time.Millisecond
	kvWatchRetryMax = 2 * time.Second
	// kvWatchStale is how long the watch may take to deliver this holder's own write of
	// its lease key before it counts as stalled and is set up again. A live watch
	// delivers it within milliseconds.
	kvWatchStale = 2 * time.Second
	// kvWatchSetup bounds setting a watch up (creating its consumer): JetStream answers
	// in milliseconds, or in seconds while a cluster elects a leader.
	kvWatchSetup = 3 * time.Second
)

// errReleased ends a watch at the holder's own release.
var errReleased = errors.New("lease released by its holder")

var _ leaseWatcher = (*kvLease)(nil)

// Watch implements leaseWatcher with a JetStream KV watch on the lease key. The key
// deleted or purged by anyone but this holder's Release, or rewritten with another
// holder's token, is a loss at once: deleted, anyone may create it again and take the
// ID, and nothing tells this holder whether someone did.
//
// It fails safe. While the NATS connection is down, or the watch cannot be set up, or
// it has not delivered this holder's own last renewal within kvWatchStale (a watch that
// stalled without its connection dropping), it vouches ErrLeaseUnverified and sets
// the watch up again, which reads the key afresh: a change made meanwhile is seen then.
// A key missing when the watch starts (expired: the bucket's TTL removes a key without
// a marker) is ErrLeaseUnverified too, until this holder's next Renew writes it again.
func (l *kvLease) Watch(ctx context.Context, vouch func(error)) error {
	nc := l.reg.nc
	status := nc.StatusChanged(nats.CONNECTED, nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	wait := kvWatchRetryMin
	for {
		started, err := l.watchOnce(ctx, status, vouch)
		switch {
		case ctx.Err() != nil, errors.Is(err, errReleased):
			return nil
		case errors.Is(err, ErrLeaseLost):
			return err
		}
		l.reg.cfg.Logger.Debug("lease watch broke; setting it up again", "worker_id", l.id, "err", err, "in", wait)
		if started {
			wait = kvWatchRetryMin
		}
		if !l.waitToRewatch(ctx, status, wait) {
			return nil
		}
		wait = min(2*wait, kvWatchRetryMax)
	}
}

// watchOnce runs one KV watch on the lease key until it breaks, the lease is lost or
// released, or ctx ends. started reports whether it had delivered the key's current
// value. A break or a loss is reported to vouch at once, before the watch is stopped
// (stopping deletes its consumer, which waits for a server that may be gone).
func (l *kvLease) watchOnce(ctx context.Context, status <-chan nats.Status, vouch func(error)) (started bool, err error) {
	drainStatus(status) // what happened before this watch is what it reads afresh
	w, cancel, err := l.startWatch(ctx, status)
	if err == nil {
		defer cancel()
		started, err = l.follow(ctx, w, status, vouch)
	}
	switch {
	case ctx.Err() != nil, errors.Is(err, errReleased):
	case errors.Is(err, ErrLeaseLost):
		vouch(err)
	default:
		vouch(fmt.Errorf("%w: watch on lease key %s/%s of worker ID %d: %w", ErrLeaseUnverified, l.reg.leases.Bucket(), l.key, l.id, err))
	}
	if w != nil {
		w.Stop() // before cancel: the watch's context is its consumer's
	}
	return started, err
}

// startWatch sets up a KV watch on the lease key; cancel ends the watch's context once
// the watch is stopped. That context also serves the consumer's later re-creations, so
// it has no deadline: a set-up that takes longer than kvWatchSetup, or that the
// connection drops under, is cancelled instead.
func (l *kvLease) startWatch(ctx context.Context, status <-chan nats.Status) (w jetstream.KeyWatcher, cancel func(), err error) {
	if s := l.reg.nc.Status(); s != nats.CONNECTED {
		return nil, nil, fmt.Errorf("NATS connection %s", s)
	}
	wctx, cancel := context.WithCancel(ctx)
	var why error // why the set-up was cancelled; read after interrupted ended
	done, interrupted := make(chan struct{}), make(chan struct{})
	go func() { // ended before startWatch returns
		defer close(interrupted)
		t := time.NewTimer(kvWatchSetup)
		defer t.Stop()
		for why == nil {
			select {
			case <-done:
				return
			case <-t.C:
				why = fmt.Errorf("not set up within %s", kvWatchSetup)
			case s := <-status:
				if s != nats.CONNECTED {
					why = fmt.Errorf("NATS connection %s while setting up", s)
				}
			}
		}
		cancel()
	}()
	w, err = l.reg.leases.Watch(wctx, l.key)
	close(done)
	<-interrupted
	if why != nil {
		if err == nil {
			w.Stop()
		}
		err = why
	}
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	return w, cancel, nil
}

// follow reads the watch until it breaks, the lease is lost or released, or ctx ends,
// vouching for the lease while it sees it is this holder's.
func (l *kvLease) follow(ctx context.Context, w jetstream.KeyWatcher, status <-chan nats.Status, vouch func(error)) (started bool, err error) {
	stale := time.NewTicker(kvWatchStale / 4)
	defer stale.Stop()
	var mine bool   // the last value delivered is this holder's
	var seen uint64 // highest revision of this holder's delivered
	// The oldest write of this holder's known not to be delivered yet, and when it was
	// made. Renewals come every beat, so the latest write alone would never be old.
	var waitRev uint64
	var waitSince time.Time
	for {
		select {
		case <-ctx.Done():
			return started, ctx.Err()
		case s := <-status:
			if s != nats.CONNECTED {
				return started, fmt.Errorf("NATS connection %s", s)
			}
		case <-stale.C:
			rev, at := l.lastWrite()
			switch {
			case rev <= seen:
				waitRev = 0
			case waitRev <= seen:
				waitRev, waitSince = rev, at
			case time.Since(waitSince) > kvWatchStale:
				return started, fmt.Errorf("it has not delivered this holder's write of revision %d within %s", waitRev, kvWatchStale)
			}
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return started, errors.New("its subscription closed")
			case e == nil: // the current value, if any, has been delivered
				started = true
				if mine {
					vouch(nil)
				} else {
					vouch(fmt.Errorf("%w: lease key %s/%s of worker ID %d is missing (expired?): waiting for this holder's renewal to write it again",
						ErrLeaseUnverified, l.reg.leases.Bucket(), l.key, l.id))
				}
				continue
			}
			if err := l.judge(e); err != nil {
				return started, err
			}
			seen = max(seen, e.Revision())
			if started && !mine {
				vouch(nil)
			}
			mine = true
		}
	}
}

// judge says what a value of the lease key means to this holder: nil when it is this
// holder's lease, errReleased for its own release, an error wrapping ErrLeaseLost for
// anything else.
func (l *kvLease) judge(e jetstream.KeyValueEntry) error {
	where := fmt.Sprintf("lease key %s/%s of worker ID %d", l.reg.leases.Bucket(), l.key, l.id)
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		if l.releasing.Load() {
			return errReleased
		}
		what := "deleted"
		if e.Operation() == jetstream.KeyValuePurge {
			what = "purged"
		}
		return fmt.Errorf("%w: %s was %s under its holder (revision %d): anyone may take the ID now", ErrLeaseLost, where, what, e.Revision())
	}
	var v leaseValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return fmt.Errorf("%w: %s was rewritten under its holder with %q (revision %d), not a lease", ErrLeaseLost, where, e.Value(), e.Revision())
	}
	if v.Token != l.token {
		return fmt.Errorf("%w: %s was rewritten under its holder (revision %d): it names node %s now", ErrLeaseLost, where, e.Revision(), v.NodeID)
	}
	return nil
}

// waitToRewatch waits d, or less when the connection comes back; false when ctx ended.
func (l *kvLease) waitToRewatch(ctx context.Context, status <-chan nats.Status, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case s := <-status:
			if s == nats.CONNECTED {
				return true
			}
		}
	}
}

// drainStatus discards the status changes already queued.
func drainStatus(status <-chan nats.Status) {
	for {
		select {
		case <-status:
		default:
			return
		}
	}
}
