package workerid

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"
)

// Worker-ID ranges in Leaf's layout. ZooKeeper, not this registry, picks a new node's
// sequence: the number of children ever created under forever/ (sequential or not), so
// it starts at 0 and only grows; deleting children does not lower it. A datacenter whose
// range starts above 0 (say 512..1023) therefore needs its own path (--zk-name, or its
// own ensemble) whose counter has been raised to the range's start before its first node
// registers: create as many placeholder children and delete them again (docs/operations.md
// "Several datacenters" has the zkCli lines). Without that the counter
// would hand out 0, 1, 2, ..., another datacenter's IDs, so a node that would get a
// sequence below the range is refused before anything is created, and one that got it
// anyway (a race with another node) deletes its node and is refused. A node whose
// existing node lies outside the range (registered before the range was set, or under
// another datacenter's path) is refused too: its timestamps were used with that ID.

// checkCounter refuses, before a new node is created under forever/, when the sequence
// ZooKeeper would give it is below MinWorkerID.
func (r *ZKRegistry) checkCounter(ctx context.Context) error {
	if r.cfg.MinWorkerID == 0 {
		return nil
	}
	var st *zk.Stat
	err := r.call(ctx, func() (err error) {
		_, st, err = r.conn.Exists(r.forever())
		return err
	})
	if err != nil {
		return fmt.Errorf("read the sequence counter of %s: %w", r.forever(), err)
	}
	// The Stat's cversion counts deletes as well as creates (ZooKeeper reports its
	// count of creates c as 2c - children), so the creates are (cversion + children) / 2.
	if next := (int64(st.Cversion) + int64(st.NumChildren)) / 2; next < r.cfg.MinWorkerID {
		return r.belowRange(next, fmt.Sprintf("ZooKeeper would give %s sequence %d under %s (the path's counter, shared by every node registered there)",
			r.cfg.Advertise, next, r.forever()))
	}
	return nil
}

// checkSequence refuses a node under forever/ whose sequence lies outside the range.
// created says the node was registered just now (nothing has used its ID).
func (r *ZKRegistry) checkSequence(node leafNode, created bool) error {
	rng := r.cfg.workerRange()
	path := r.forever() + "/" + node.name
	switch {
	case node.seq > rng.Max && created:
		return fmt.Errorf("%w: %w: worker ID %d from %s is above %d, the top of %s: use --zk-recycle or a new --zk-name (docs/errors.md#zk-worker-range)",
			ErrZKSequenceOutOfRange, ErrNoWorkerID, node.seq, path, rng.Max, rng.describe())
	case node.seq > rng.Max:
		return fmt.Errorf("%w: %w: this node's %s holds worker ID %d, above %s: use --zk-recycle, or a --zk-name set up for this range (docs/errors.md#zk-worker-range)",
			ErrZKSequenceOutOfRange, ErrWorkerIDOutOfRange, path, node.seq, rng.describe())
	case node.seq < rng.Min && created:
		return r.belowRange(node.seq, fmt.Sprintf("ZooKeeper gave %s sequence %d (another node registered at the same moment); the node was removed again", path, node.seq))
	case node.seq < rng.Min:
		return fmt.Errorf("%w: %w: this node's %s holds worker ID %d, below %s: give this node a --zk-name set up for the range (docs/errors.md#zk-worker-range)",
			ErrZKSequenceOutOfRange, ErrWorkerIDOutOfRange, path, node.seq, rng.describe())
	}
	return nil
}

// belowRange is the refusal of a sequence below the range; what says where it came from.
func (r *ZKRegistry) belowRange(seq int64, what string) error {
	rng := r.cfg.workerRange()
	return fmt.Errorf("%w: %w: %s, below %s: a --zk-name whose counter was raised to %d (%d more children created under %s), or --zk-recycle (docs/operations.md#several-datacenters)",
		ErrZKSequenceOutOfRange, ErrWorkerIDOutOfRange, what, rng.describe(), rng.Min, rng.Min-seq, r.forever())
}

// checkCached refuses a cache-file worker ID that another registry issued (or that does
// not say which registry did), and one outside the range.
func (r *ZKRegistry) checkCached(e cacheEntry) error {
	switch {
	case e.Registry == "":
		return fmt.Errorf("%w: %w: cache file %s (worker ID %d) does not say which registry issued its worker ID (written by an earlier version), so it cannot stand in for %s; start once with ZooKeeper reachable",
			ErrZKUnavailable, ErrCacheOtherRegistry, r.cfg.Cache.Path, e.WorkerID, r.Identity())
	case e.Registry != r.Identity():
		return fmt.Errorf("%w: %w: cache file %s holds worker ID %d from registry %q, not this one (%q): start with ZooKeeper reachable, or that registry (docs/errors.md#cache-registry)",
			ErrZKUnavailable, ErrCacheOtherRegistry, r.cfg.Cache.Path, e.WorkerID, e.Registry, r.Identity())
	}
	if rng := r.cfg.workerRange(); !rng.Contains(e.WorkerID) {
		return fmt.Errorf("%w: %w: ZooKeeper unreachable and cache file %s holds worker ID %d, outside this deployment's %s",
			ErrZKUnavailable, ErrWorkerIDOutOfRange, r.cfg.Cache.Path, e.WorkerID, rng.describe())
	}
	return nil
}

// removeOutOfRange deletes a node this registry created just now whose sequence lies
// outside the range: nothing could use it, and leaving it would only confuse operators.
func (r *ZKRegistry) removeOutOfRange(ctx context.Context, path string, seq int64) {
	if r.cfg.workerRange().Contains(seq) {
		return
	}
	err := r.call(context.WithoutCancel(ctx), func() error { return r.conn.Delete(path, -1) })
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		r.log.Warn("could not remove a node outside the worker-ID range", "node", path, "err", err)
	}
}
