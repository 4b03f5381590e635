package workerid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// One worker ID, one live holder, whatever the registry (issue 21). Registries keep
// their own nodes apart, but not from each other: two ZooKeeper names on one ZooKeeper,
// one --worker-id given twice, a node switched from one registry to another, each hand
// the same worker ID to two dispensers that both serve. So every dispenser also fences
// the worker ID in the one place all of a deployment's dispensers share, whatever their
// registries: its record worker-<id> in <prefix>_forever.
//
// The record is written only with a compare-and-set on the revision this holder last
// wrote (or claimed), so any write by anyone else makes this holder's next one fail.
// A holder may take the record over only when it is free:
//   - there is none;
//   - it is this run's own (Record.Instance: a token per run, since two hosts can be
//     given one --node-id);
//   - it is released (a clean stop, or a holder that lost the ID, says so);
//   - it was written by the run whose token this node's cache file holds: that run used
//     this data dir, which one process at a time may hold, so it has ended;
//   - its writer is gone: the record has not been rewritten for StaleAfter (a holder
//     rewrites it every record interval), judged without trusting another node's clock,
//     by the server's time of the write against the server's time now, and by watching
//     whether its revision moves.
//
// A record rewritten while this node watches is another live holder's: the node refuses
// (ErrWorkerIDInUse), without ever having served with the ID. A holder's generator may
// issue only up to the ceiling its last successful fenced write allowed (the heartbeat
// raises it only after such a write), and a node that takes the record over waits past
// that ceiling (the clock guard reads the record it claimed), so even a holder wrongly
// judged gone never shares a timestamp with the next: its next write fails, and it stops
// at once for good on that worker ID.

// ErrWorkerIDInUse is returned when another live dispenser holds this node's worker ID
// (its record in the forever bucket is another run's, and is being rewritten): the two
// were given the same worker ID, and this node does not serve snowflake IDs with it.
var ErrWorkerIDInUse = errors.New("worker ID held by another live dispenser")

// fenceLost is the error of a worker ID lost because its record is no longer this
// holder's (someone else wrote it): it prints as the error it holds.
type fenceLost struct{ error }

func (e *fenceLost) Unwrap() error { return e.error }

// isFenceLost reports whether err says the worker record is no longer this holder's.
func isFenceLost(err error) bool {
	var fl *fenceLost
	return errors.As(err, &fl)
}

// defaultStaleRecords is how many record intervals a worker ID's record may go
// unrewritten before its writer counts as gone (KeeperConfig.StaleAfter).
const defaultStaleRecords = 5

// workerFence is this holder's fence on one worker ID: the revision it may write on.
// The heartbeat writes through it; it is safe for concurrent use.
type workerFence struct {
	forever  *Forever
	id       int64
	nodeID   string
	instance string

	mu    sync.Mutex
	rev   uint64 // the revision this holder claimed or last wrote; 0: create
	prior Record // the record claimed: its timestamp and ceiling are never written lower
	last  Record // the last record this holder wrote; zero before the first
}

// write writes this holder's record (ts and ceiling, never below the claimed record's
// or this holder's last; released at a clean stop) with a compare-and-set on the holder's revision. It fails
// with an error wrapping errRecordMoved when anyone else wrote the record since.
func (w *workerFence) write(ctx context.Context, ts, ceiling int64, released bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Never lower: a released record keeps the ceiling its holder was allowed (its
	// timestamp says what it issued), so the next holder's floor is the highest ceiling.
	r := Record{
		WorkerID: w.id, Timestamp: max(ts, w.prior.Timestamp, w.last.Timestamp),
		Ceiling: max(ceiling, w.prior.Ceiling, w.last.Ceiling),
		NodeID:  w.nodeID, Instance: w.instance, Released: released,
	}
	rev, err := w.forever.casWorker(ctx, w.id, r, w.rev)
	if err != nil {
		return err
	}
	w.rev, w.last = rev, r
	return nil
}

// resolve is called after write found the record moved: it reads it again and decides
// from what it says. It adopts the record's revision, so that the next write takes it
// back by compare-and-set, when the record holds nothing this holder's own ceiling does
// not cover:
//   - it is this run's own (an earlier write went through although an error was seen),
//     and reclaim is "";
//   - once this holder has written: it names no live holder (deleted, not a record,
//     released, or without node and run) and allows no more than the ceiling this holder
//     last wrote; or it is another run's with a lower ceiling than that, which no
//     dispenser that claimed the record writes (a claimer starts above every ceiling it
//     read, this holder's among them): reclaim says which.
//
// Otherwise the worker ID is no longer this holder's: an error wrapping ErrLeaseLost,
// and ErrWorkerIDInUse when another run holds it (its record is not released).
func (w *workerFence) resolve(ctx context.Context) (reclaim string, err error) {
	e, err := w.forever.getWorkerEntry(ctx, w.id)
	if err != nil {
		return "", err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.rev != 0 && !e.unreadable && e.rec.Instance == w.instance {
		w.rev = e.rev
		return "", nil
	}
	if why := w.reclaimable(e); why != "" {
		w.rev = e.rev
		return why, nil
	}
	switch {
	case e.rev == 0:
		return "", &fenceLost{fmt.Errorf("%w: worker ID %d's record %s was deleted from %s under this holder", ErrLeaseLost, w.id, WorkerKey(w.id), w.forever.Bucket())}
	case e.unreadable:
		return "", &fenceLost{fmt.Errorf("%w: worker ID %d's record %s in %s was overwritten with a value that is not a record", ErrLeaseLost, w.id, WorkerKey(w.id), w.forever.Bucket())}
	case e.rec.Released:
		return "", &fenceLost{fmt.Errorf("%w: worker ID %d's record %s in %s was taken over by node %s, which has released it since (ceiling %s, above this holder's %s)",
			ErrLeaseLost, w.id, WorkerKey(w.id), w.forever.Bucket(), e.rec.NodeID, fmtMs(e.rec.Ceiling), fmtMs(w.last.Ceiling))}
	}
	return "", &fenceLost{fmt.Errorf("%w (%w): worker ID %d is held by node %s (%s), which wrote its record %s in %s after this node claimed it: %s",
		ErrLeaseLost, ErrWorkerIDInUse, w.id, e.rec.NodeID, runOf(e.rec), WorkerKey(w.id), w.forever.Bucket(), sameIDAdvice)}
}

// reclaimable says why record e, written by someone else under this holder, may be taken
// back at once (see resolve), "" when it may not. w.mu is held.
func (w *workerFence) reclaimable(e workerEntry) string {
	mine := w.last.Ceiling
	if w.last.Instance == "" {
		return "" // nothing written yet: the start claims the record anew
	}
	allowed := max(e.rec.Ceiling, e.rec.Timestamp)
	switch {
	case e.rev == 0:
		return "it was deleted"
	case e.unreadable:
		return "it was overwritten with a value that is not a record"
	case e.rec.Released && allowed <= mine:
		return fmt.Sprintf("it was marked released by node %q (%s), allowing no more than this holder's ceiling", e.rec.NodeID, runOf(e.rec))
	case e.rec.NodeID == "" && e.rec.Instance == "" && allowed <= mine:
		return "it names no holder"
	case !e.rec.Released && allowed < mine:
		return fmt.Sprintf("it names node %q (%s) with a ceiling below this holder's, which no dispenser that claimed it writes", e.rec.NodeID, runOf(e.rec))
	}
	return ""
}

// release marks the record released, keeping the last timestamp and ceiling this holder
// wrote, when it stops issuing with the worker ID other than by a clean stop (its lease
// lost, a failed start), so that the next holder need not wait to see it gone. It
// writes only where the record is still this holder's (a record someone else wrote
// since is left alone, without an error), and only once something was written.
func (w *workerFence) release(ctx context.Context) error {
	w.mu.Lock()
	last := w.last
	w.mu.Unlock()
	if last.Instance == "" || last.Released {
		return nil
	}
	if err := w.write(ctx, last.Timestamp, last.Ceiling, true); err != nil && !errors.Is(err, errRecordMoved) {
		return err
	}
	return nil
}

// sameIDAdvice is what to do when two dispensers were given one worker ID.
const sameIDAdvice = "two dispensers of this deployment were given the same worker ID: give them one worker-ID registry (the same --worker-registry, ZooKeeper and --zk-name, or MySQL table), never the same --worker-id twice, or stop the other one"

// runOf names the run that wrote r, for messages.
func runOf(r Record) string {
	if r.Instance == "" {
		return "a version without the worker-ID fence"
	}
	return "run " + r.Instance
}

// claimer decides whether this node may take a worker ID's record (see the top of this
// file), and waits, watching it, while that is not known yet.
type claimer struct {
	forever    *Forever
	nodeID     string
	instance   string
	cache      *CacheFile // this process's alone (the dispenser's data dir is locked); nil: none
	staleAfter time.Duration
	poll       time.Duration // how often a record is read while it is watched
	log        *slog.Logger
}

// claim returns the fence on worker ID id once its record is free for this node, or an
// error wrapping ErrWorkerIDInUse when another live run holds it. It may wait up to
// staleAfter, watching the record, and returns early with ctx's error.
func (c claimer) claim(ctx context.Context, id int64) (*workerFence, error) {
	for {
		e, err := c.forever.getWorkerEntry(ctx, id)
		if err != nil {
			return nil, err
		}
		if why := c.free(e, id); why != "" {
			return c.fence(e, id, why), nil
		}
		age, err := c.age(ctx, e)
		if err != nil {
			return nil, err
		}
		if age >= c.staleAfter {
			return c.fence(e, id, fmt.Sprintf("its writer, node %s (%s), has not rewritten it for %s", e.rec.NodeID, runOf(e.rec), age.Round(time.Millisecond))), nil
		}
		c.log.Info("worker ID's record is another run's: watching it to see whether its writer is alive",
			"worker_id", id, "holder_node", e.rec.NodeID, "holder", runOf(e.rec), "age", age.Round(time.Millisecond),
			"watch_for", (c.staleAfter - age).Round(time.Millisecond))
		moved, err := c.watch(ctx, id, e, c.staleAfter-age)
		switch {
		case err != nil:
			return nil, err
		case moved == nil:
			return c.fence(e, id, fmt.Sprintf("its writer, node %s (%s), did not rewrite it for %s", e.rec.NodeID, runOf(e.rec), c.staleAfter.Round(time.Millisecond))), nil
		case c.free(*moved, id) != "":
			continue // released, or gone, while watched: look again
		}
		return nil, fmt.Errorf("%w: worker ID %d is held by node %s (%s), which is alive: its record %s in %s was rewritten while this node watched, and this node serves no snowflake ID with it; %s",
			ErrWorkerIDInUse, id, moved.rec.NodeID, runOf(moved.rec), WorkerKey(id), c.forever.Bucket(), sameIDAdvice)
	}
}

// free says why record e of worker ID id may be taken at once, "" when it may not be
// known yet.
func (c claimer) free(e workerEntry, id int64) string {
	switch {
	case e.rev == 0:
		return "it has no record"
	case e.unreadable:
		return "its value is not a record" // no dispenser wrote it; the floor comes from the node records
	case e.rec.Instance == c.instance:
		return "the record is this run's own"
	case e.rec.Released:
		return fmt.Sprintf("node %s released it", e.rec.NodeID)
	case e.rec.Instance != "" && c.cache != nil:
		if ce, err := c.cache.Load(); err == nil && ce.Instance == e.rec.Instance && ce.NodeID == c.nodeID && ce.WorkerID == id {
			return "the record is this data dir's previous run's, which has ended"
		}
	}
	return ""
}

// age is how long ago e was written, by the server's clock; 0 when the server does not
// say its time (the full staleAfter is then watched).
func (c claimer) age(ctx context.Context, e workerEntry) (time.Duration, error) {
	now, err := c.forever.serverTime(ctx)
	if err != nil {
		return 0, err
	}
	if now.IsZero() || e.written.IsZero() || now.Before(e.written) {
		return 0, nil
	}
	return now.Sub(e.written), nil
}

// watch reads worker ID id's record every poll for up to d: it returns the record once
// it has moved from e (rewritten, released or deleted), nil when it did not move.
func (c claimer) watch(ctx context.Context, id int64, e workerEntry, d time.Duration) (*workerEntry, error) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(c.poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("watch worker ID %d's record: %w", id, ctx.Err())
		case <-deadline.C:
			return nil, nil
		case <-tick.C:
		}
		now, err := c.forever.getWorkerEntry(ctx, id)
		if err != nil {
			return nil, err
		}
		if now.rev != e.rev {
			return &now, nil
		}
	}
}

// fence is the fence on record e, taken for reason why.
func (c claimer) fence(e workerEntry, id int64, why string) *workerFence {
	c.log.Info("worker ID's record claimed", "worker_id", id, "why", why, "revision", e.rev)
	return &workerFence{forever: c.forever, id: id, nodeID: c.nodeID, instance: c.instance, rev: e.rev, prior: e.rec}
}
