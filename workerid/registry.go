package workerid

import (
	"context"
	"errors"
	"time"
)

// Registry hands out snowflake worker IDs. Implementations: static (a flag), JetStream KV
// leases, ZooKeeper in Leaf's layout (permanent, or recycled leases) and MySQL.
type Registry interface {
	// Acquire claims a worker ID for this node. Two nodes never hold the same ID at once.
	// It may block on its backend until ctx ends (e.g. waiting for a ZooKeeper session);
	// when every ID in range is taken it returns an error wrapping ErrNoWorkerID rather
	// than waiting for one to free up. The Lease reports the highest timestamp any
	// previous holder recorded for the ID, so the caller can start past it.
	Acquire(ctx context.Context) (Lease, error)
}

// Lease is a worker ID held by this node.
//
// What the clock guard relies on (Heartbeat raises the generator's ceiling to
// ts + interval + borrow-max once Renew(ts) returned nil, and Guard.Start at the next
// start waits past Recorded() + interval + borrow-max):
//   - after Renew(ts) or Release(ts) returned nil, every later Acquire of the same ID
//     (by any node) reports Recorded() >= ts; the stored value never goes down;
//   - for an expiring lease, Renew fails with ErrLeaseLost when any other node acquired
//     the ID since this lease's previous successful Renew (or its Acquire).
type Lease interface {
	// WorkerID is the claimed ID, 0..max for the layout in use.
	WorkerID() int64

	// Recorded is the highest timestamp (Unix ms) recorded for this worker ID before
	// Acquire returned, 0 when there is none. For a permanent ID that is this node's own
	// earlier record; for a recycled one, the previous holders'.
	Recorded() int64

	// TTL is how long the registry keeps the ID for this node without a Renew. Zero means
	// the ID is held for good (Leaf's ZooKeeper layout, static, MySQL).
	TTL() time.Duration

	// Renew records ts (Unix ms: the highest timestamp issued or borrowed so far) and,
	// for an expiring lease, extends it. It returns ErrLeaseLost when the ID is no longer
	// this node's; any other error is transient (the heartbeat retries next beat). Called
	// by one goroutine at a time.
	Renew(ctx context.Context, ts int64) error

	// Release gives an expiring ID back at a clean stop (after the last ID was issued);
	// for permanent IDs it only records ts. Renew must not be called afterwards.
	Release(ctx context.Context, ts int64) error
}

// ErrLeaseLost is returned when this node's worker ID lease expired or was taken over:
// it must stop issuing snowflake IDs.
var ErrLeaseLost = errors.New("worker ID lease lost")

// ErrNoWorkerID is returned by Acquire when every worker ID in range is taken.
var ErrNoWorkerID = errors.New("no free worker ID")
