package workerid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
)

// zkWatchRetry is how soon a lease watch looks again after a ZooKeeper call failed on a
// live session, or while its recycled lease node is missing; a change of the session
// state makes it look at once.
const zkWatchRetry = 250 * time.Millisecond

var (
	_ leaseWatcher = (*zkRecycleLease)(nil)
	_ leaseWatcher = (*zkForeverLease)(nil)
)

// Watch implements leaseWatcher for recycle mode with a ZooKeeper watch on the lease
// node. The node found deleted while the session that held it is alive (only a delete
// does that: ZooKeeper removes it itself only with its session), or rewritten with
// another holder's token, is a loss at once; a deletion is judged by reading the node
// again, since this holder's own take-over from an earlier session of its own deletes
// and creates it in one step.
//
// It fails safe. In recycle mode the worker ID is only this node's while ZooKeeper
// vouches for its session, so while the client has no session (disconnected, or the
// session expired), while a read of the node fails, and while the node is missing after
// a session expiry (the next Renew writes it again when nobody took the ID), it vouches
// ErrLeaseUnverified, and looks again once the session is back. go-zk sets the node's
// watch again on a reconnect within the session, and ZooKeeper then reports a change
// made meanwhile.
func (l *zkRecycleLease) Watch(ctx context.Context, vouch func(error)) error {
	r := l.reg
	var events <-chan zk.Event // the node's armed watch; nil when none is
	for {
		state := r.stateChanged()
		var retry <-chan time.Time
		if !r.hasSession() {
			vouch(fmt.Errorf("%w: worker ID %d: no ZooKeeper session with %v (state %s)", ErrLeaseUnverified, l.id, r.cfg.Servers, r.conn.State()))
		} else {
			armed, err := l.look(ctx, events == nil)
			switch {
			case ctx.Err() != nil:
				return nil
			case armed != nil:
				events = armed
			}
			vouch(err)
			if errors.Is(err, ErrLeaseLost) {
				return err
			}
			if err != nil {
				retry = time.After(zkWatchRetry)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-state:
		case <-retry:
		case ev := <-events:
			events = nil // ZooKeeper watches fire once
			if ev.Type != zk.EventNodeDeleted {
				continue // data changed, or not watching any more (session expired): look again
			}
			if l.releasing.Load() {
				return nil
			}
			// Look again at once (events is nil): deleted under this holder's live
			// session is a loss (look says so), unless it was this holder's own
			// take-over from an earlier session (zk_session.go), which leaves the node
			// this session's.
		}
	}
}

// look reads the lease node, arming a watch on it when arm is set and the node exists,
// and judges it: nil when this session holds it with this holder's token, an error
// wrapping ErrLeaseLost when it is someone else's or was deleted under a live session,
// ErrLeaseUnverified when it cannot tell.
func (l *zkRecycleLease) look(ctx context.Context, arm bool) (<-chan zk.Event, error) {
	r := l.reg
	p := r.leasePath(l.id)
	var data []byte
	var st *zk.Stat
	var events <-chan zk.Event
	err := r.call(ctx, func() (err error) {
		if arm {
			data, st, events, err = r.conn.GetW(p)
		} else {
			data, st, err = r.conn.Get(p)
		}
		return err
	})
	session := r.conn.SessionID() // read after the call: the session it ran on, or a later one
	switch {
	case errors.Is(err, zk.ErrNoNode):
		if session == l.session.Load() && !l.releasing.Load() {
			return nil, fmt.Errorf("%w: lease node %s of worker ID %d was deleted while this holder's session was alive: anyone may take the ID now",
				ErrLeaseLost, p, l.id)
		}
		return nil, fmt.Errorf("%w: lease node %s of worker ID %d is missing (the session expired): waiting for this holder's renewal to write it again",
			ErrLeaseUnverified, p, l.id)
	case err != nil:
		return nil, fmt.Errorf("%w: read lease node %s of worker ID %d: %w", ErrLeaseUnverified, p, l.id, err)
	}
	var v zkLeaseValue
	if err := json.Unmarshal(data, &v); err != nil || v.Token != l.token {
		return events, fmt.Errorf("%w: lease node %s of worker ID %d was rewritten under its holder: it names %q now", ErrLeaseLost, p, l.id, v.Advertise)
	}
	if st.EphemeralOwner != session {
		// An earlier session of this holder's (its client was replaced): take the node
		// over now rather than at the next renewal. The armed watch then sees the node
		// deleted and created, and looks again.
		if err := r.takeOver(ctx, p, st.Version, l.leaseVal); err != nil {
			return events, fmt.Errorf("%w: lease node %s of worker ID %d is held by an earlier session of this holder: take-over: %w",
				ErrLeaseUnverified, p, l.id, err)
		}
		l.session.Store(session)
		r.log.Info("took the worker ID's lease node over from this holder's earlier session", "worker_id", l.id, "path", p)
		return events, nil
	}
	l.session.Store(st.EphemeralOwner)
	return events, nil
}

// Watch implements leaseWatcher for Leaf's layout with a ZooKeeper watch on this
// ip:port's node under forever/: the node deleted is a loss at once, since the worker
// ID is its sequence number and the next start would register under a new one. The ID
// is this node's for good, and Leaf's layout runs on without ZooKeeper (it even starts
// from the cache file), so ZooKeeper being unreachable is not a reason to stop: it never
// vouches ErrLeaseUnverified; the watch is set again once ZooKeeper is back, and reports
// a deletion made meanwhile then. A lease started from the cache file is watched once
// its Renew found its node.
func (l *zkForeverLease) Watch(ctx context.Context, vouch func(error)) error {
	select {
	case <-l.found:
	case <-ctx.Done():
		return nil
	}
	r, p := l.reg, l.path // path does not change once found
	lost := func() error {
		err := fmt.Errorf("%w: this node's worker ID node %s (worker ID %d) was deleted", ErrLeaseLost, p, l.id)
		vouch(err)
		return err
	}
	var events <-chan zk.Event // the node's armed watch; nil when none is
	for {
		state := r.stateChanged()
		var retry <-chan time.Time
		if events == nil && r.hasSession() {
			var exists bool
			err := r.call(ctx, func() (err error) {
				exists, _, events, err = r.conn.ExistsW(p)
				return err
			})
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				events, retry = nil, time.After(zkWatchRetry)
			case !exists:
				return lost()
			default:
				vouch(nil)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-state:
		case <-retry:
		case ev := <-events:
			events = nil // ZooKeeper watches fire once; the node's data changes every beat
			if ev.Type == zk.EventNodeDeleted {
				return lost()
			}
		}
	}
}
