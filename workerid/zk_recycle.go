package workerid

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/wire"
)

// Recycle mode (Recycle true; Leaf forks call it zk_recycle): the lease on worker ID n is
// the ephemeral node /snowflake/<name>/leafbus/leases/<n>, created only if absent, so no
// two sessions hold one ID even when they start at the same instant. The lease time is
// the session timeout: ZooKeeper itself deletes the node once it heard nothing from the
// holder's session for that long, judged on the servers' own (monotonic) timers, so no
// clocks of two machines are compared. The session timeout the server grants must be at
// least TTL (checked: the heartbeat suspends the generator at TTL/2 since the start of
// its last renewal, and every renewal is a request on the session, which restarts the
// server's timer no earlier). The persistent node /snowflake/<name>/leafbus/workers/<n>
// holds the highest timestamp any holder recorded and the last holder's token, as
// kv_registry's workers bucket does: a new holder starts past it (Recorded) and a holder
// whose token was replaced has lost the ID (ErrLeaseLost). IDs that Leaf-layout nodes of
// the same name hold are skipped.

// leasePath is worker ID id's lease: an ephemeral node of its holder's session.
func (r *ZKRegistry) leasePath(id int64) string {
	return r.base() + "/leafbus/leases/" + strconv.FormatInt(id, 10)
}

// workerPath is worker ID id's persistent record: the highest timestamp any holder
// recorded and the last holder's token.
func (r *ZKRegistry) workerPath(id int64) string {
	return r.base() + "/leafbus/workers/" + strconv.FormatInt(id, 10)
}

// zkLeaseValue is the content of a lease node (wire.ZKLease).
type zkLeaseValue = wire.ZKLease

// zkWorkerValue is the content of a workers node (wire.ZKWorker).
type zkWorkerValue = wire.ZKWorker

// acquireLease takes the lowest free worker ID of the range as an ephemeral node of this
// session.
func (r *ZKRegistry) acquireLease(ctx context.Context) (Lease, error) {
	granted := r.granted.Load()
	if granted == 0 {
		return nil, fmt.Errorf("recycle mode: the session timeout ZooKeeper granted is unknown (go-zk did not log it), so the lease time cannot be vouched for")
	}
	if g := time.Duration(granted) * time.Millisecond; g < r.cfg.TTL {
		return nil, fmt.Errorf("%w: recycle mode: ZooKeeper granted a session timeout of %s, below --lease-ttl %s: lower --lease-ttl to %s or raise maxSessionTimeout (docs/errors.md#zk-session-timeout)",
			ErrInvalidConfig, g, r.cfg.TTL, g)
	}
	leases := path.Dir(r.leasePath(0))
	if err := r.ensurePath(ctx, leases); err != nil {
		return nil, err
	}
	if err := r.ensurePath(ctx, path.Dir(r.workerPath(0))); err != nil {
		return nil, err
	}
	taken := map[int64]bool{}
	var children []string
	err := r.call(ctx, func() (err error) {
		children, _, err = r.conn.Children(leases)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", leases, err)
	}
	for _, c := range children {
		if id, err := strconv.ParseInt(c, 10, 64); err == nil {
			taken[id] = true
		}
	}
	// Leaf-layout nodes of the same name hold theirs for good.
	nodes, err := r.listForever(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		taken[n.seq] = true
	}

	token := rand.Text() // tells this holding apart from every other, this node's earlier ones included
	val, _ := json.Marshal(zkLeaseValue{Advertise: r.cfg.Advertise, Token: token})
	for id := r.cfg.MinWorkerID; id <= r.cfg.MaxWorkerID; id++ {
		if taken[id] {
			continue
		}
		p := r.leasePath(id)
		err := r.call(ctx, func() error {
			_, err := r.conn.Create(p, val, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
			return err
		})
		if errors.Is(err, zk.ErrNodeExists) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lease worker ID %d at %s: %w", id, p, err)
		}
		l := &zkRecycleLease{reg: r, id: id, token: token, leaseVal: val}
		l.session.Store(r.conn.SessionID())
		recorded, err := l.claimWorker(ctx)
		if err != nil {
			_ = r.call(context.WithoutCancel(ctx), func() error { return r.conn.Delete(p, -1) })
			return nil, err
		}
		l.recorded = recorded
		r.log.Info("leased worker ID (ZooKeeper recycle)", "worker_id", id, "path", p, "ttl", r.cfg.TTL,
			"recorded", recorded, "recorded_time", fmtMs(recorded))
		return l, nil
	}
	rng := r.cfg.workerRange()
	return nil, fmt.Errorf("%w: all %d of this deployment's %s under %s are leased or held by Leaf-layout nodes",
		ErrNoWorkerID, rng.Len(), rng.describe(), leases)
}

// zkRecycleLease is one session's lease on one worker ID.
type zkRecycleLease struct {
	reg      *ZKRegistry
	id       int64
	token    string
	leaseVal []byte
	recorded int64

	mu       sync.Mutex
	released bool

	// For the watch, which runs beside Renew (zk_watch.go).
	session   atomic.Int64 // the session that holds the lease node, as last seen
	releasing atomic.Bool  // Release is deleting the node: the watch will see it go
}

var _ Lease = (*zkRecycleLease)(nil)

func (l *zkRecycleLease) WorkerID() int64    { return l.id }
func (l *zkRecycleLease) Recorded() int64    { return l.recorded }
func (l *zkRecycleLease) TTL() time.Duration { return l.reg.cfg.TTL }

// Renew checks that this session still holds the lease node (re-creating it after a
// session expiry when nobody claimed the ID since: the worker record still carries this
// holder's token), then raises the worker record to ts with a compare-and-set that
// fails with ErrLeaseLost when another holder's token is on it.
func (l *zkRecycleLease) Renew(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return fmt.Errorf("renew worker ID %d: lease already released", l.id)
	}
	if !l.reg.hasSession() {
		return l.reg.errNoSession()
	}
	if err := l.checkLease(ctx); err != nil {
		return err
	}
	return l.recordWorker(ctx, ts)
}

// checkLease makes sure this session holds the lease node.
func (l *zkRecycleLease) checkLease(ctx context.Context) error {
	r := l.reg
	p := r.leasePath(l.id)
	var data []byte
	var st *zk.Stat
	err := r.call(ctx, func() (err error) {
		data, st, err = r.conn.Get(p)
		return err
	})
	switch {
	case err == nil:
		var v zkLeaseValue
		_ = json.Unmarshal(data, &v)
		if st.EphemeralOwner == r.conn.SessionID() {
			if v.Token != l.token {
				return fmt.Errorf("%w: lease node %s of worker ID %d was rewritten under its holder: it names %s now", ErrLeaseLost, p, l.id, v.Advertise)
			}
			l.session.Store(st.EphemeralOwner)
			return nil
		}
		if v.Token == l.token {
			// An earlier session of this holder's (its client was replaced): take the
			// node over in one multi-op, so that nobody can lease the ID in between.
			if err := r.takeOver(ctx, p, st.Version, l.leaseVal); err != nil {
				return fmt.Errorf("take over lease node %s from this holder's earlier session: %w", p, err)
			}
			l.session.Store(r.conn.SessionID())
			r.log.Info("took the worker ID's lease node over from this holder's earlier session", "worker_id", l.id, "path", p)
			return nil
		}
		return fmt.Errorf("%w: worker ID %d is now held by %s", ErrLeaseLost, l.id, v.Advertise)
	case errors.Is(err, zk.ErrNoNode):
	default:
		return fmt.Errorf("check lease %s: %w", p, err)
	}
	// The session expired and took the node along. Safe to take it back only if nobody
	// held the ID since: then the worker record still carries our token.
	prev, _, err := l.readWorker(ctx)
	if err != nil {
		return err
	}
	if prev.Token != l.token {
		return fmt.Errorf("%w: worker ID %d expired and was claimed by %s", ErrLeaseLost, l.id, prev.Advertise)
	}
	err = r.call(ctx, func() error {
		_, err := r.conn.Create(p, l.leaseVal, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		return err
	})
	if errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("%w: worker ID %d expired and another node is taking it", ErrLeaseLost, l.id)
	}
	if err != nil {
		return fmt.Errorf("re-create expired lease %s: %w", p, err)
	}
	l.session.Store(r.conn.SessionID())
	r.log.Warn("worker ID lease had expired with the session; re-created it (nobody held the ID in between)",
		"worker_id", l.id, "ttl", r.cfg.TTL)
	return nil
}

// Release records ts and deletes the lease node, so the ID is free at once.
func (l *zkRecycleLease) Release(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	r := l.reg
	if err := l.recordWorker(ctx, ts); err != nil {
		return err
	}
	p := r.leasePath(l.id)
	l.releasing.Store(true) // the watch is to take the deletion for what it is
	defer func() { l.releasing.Store(l.released) }()
	err := r.call(ctx, func() error {
		_, st, err := r.conn.Get(p)
		if err != nil {
			return err
		}
		if st.EphemeralOwner != r.conn.SessionID() {
			return nil // someone else's now (or a lost session): not ours to delete
		}
		return r.conn.Delete(p, st.Version)
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("release worker ID %d: %w", l.id, err)
	}
	l.released = true
	r.log.Info("released worker ID", "worker_id", l.id, "recorded", ts, "recorded_time", fmtMs(ts))
	return nil
}

// claimWorker puts this holder's token on the worker record, keeping its timestamp, and
// returns that timestamp: the highest any previous holder recorded.
func (l *zkRecycleLease) claimWorker(ctx context.Context) (int64, error) {
	for attempt := 0; attempt < casAttempts; attempt++ {
		prev, version, err := l.readWorker(ctx)
		if err != nil {
			return 0, err
		}
		ok, err := l.writeWorker(ctx, zkWorkerValue{WorkerID: l.id, Timestamp: prev.Timestamp, Advertise: l.reg.cfg.Advertise, Token: l.token}, version)
		if err != nil {
			return 0, err
		}
		if ok {
			return prev.Timestamp, nil
		}
	}
	return 0, fmt.Errorf("claim %s: it kept changing", l.reg.workerPath(l.id))
}

// recordWorker raises the worker record to ts; ErrLeaseLost when another holder's token
// is on it.
func (l *zkRecycleLease) recordWorker(ctx context.Context, ts int64) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		prev, version, err := l.readWorker(ctx)
		if err != nil {
			return err
		}
		if version >= 0 && prev.Token != l.token {
			return fmt.Errorf("%w: worker ID %d was claimed by %s (record %s)", ErrLeaseLost, l.id, prev.Advertise, fmtMs(prev.Timestamp))
		}
		if version >= 0 && prev.Timestamp >= ts {
			return nil
		}
		ok, err := l.writeWorker(ctx, zkWorkerValue{WorkerID: l.id, Timestamp: ts, Advertise: l.reg.cfg.Advertise, Token: l.token}, version)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("record %d in %s: it kept changing", ts, l.reg.workerPath(l.id))
}

// readWorker returns the worker record and its version; version -1 when there is none.
func (l *zkRecycleLease) readWorker(ctx context.Context) (zkWorkerValue, int32, error) {
	r := l.reg
	p := r.workerPath(l.id)
	var data []byte
	var st *zk.Stat
	err := r.call(ctx, func() (err error) {
		data, st, err = r.conn.Get(p)
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return zkWorkerValue{}, -1, nil
	}
	if err != nil {
		return zkWorkerValue{}, 0, fmt.Errorf("read %s: %w", p, err)
	}
	var v zkWorkerValue
	if err := json.Unmarshal(data, &v); err != nil {
		return zkWorkerValue{}, 0, fmt.Errorf("%s is not a worker record (%q): %w", p, data, err)
	}
	return v, st.Version, nil
}

// writeWorker writes v if the record is still at version (-1: absent); false when
// someone wrote in between.
func (l *zkRecycleLease) writeWorker(ctx context.Context, v zkWorkerValue, version int32) (bool, error) {
	r := l.reg
	p := r.workerPath(l.id)
	data, err := json.Marshal(v)
	if err != nil {
		return false, fmt.Errorf("encode worker record: %w", err)
	}
	err = r.call(ctx, func() error {
		if version < 0 {
			_, err := r.conn.Create(p, data, 0, zk.WorldACL(zk.PermAll))
			return err
		}
		_, err := r.conn.Set(p, data, version)
		return err
	})
	if errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrBadVersion) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", p, err)
	}
	return true, nil
}
