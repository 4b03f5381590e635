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

// Identifier is implemented by every Registry: which registry it is (kind and which one), so
// a worker ID is only ever trusted by the registry that issued it, and a deployment can check
// that its dispensers share one registry.
//
// The forms: "static"; "kv <leases bucket>" ("kv leaf_leases"); "zk <path>"
// ("zk /snowflake/leafbus"), with " (recycle)" appended in recycle mode, whose worker IDs
// live elsewhere under that path; "mysql <host>:<port>/<schema>.leaf_workerid_alloc" with
// the host name and port the server reports (@@hostname, @@port), not the DSN's, which
// differs between aliases of one server.
type Identifier interface{ Identity() string }

// Lease is a worker ID held by this node.
//
// What the clock guard relies on (Heartbeat raises the generator's ceiling to
// ts + interval + borrow-max + ceiling lead once Renew(ts) returned nil, and records
// that ceiling beside ts; Guard.Start at the next start waits past the recorded ceiling,
// or Recorded() + interval + borrow-max where no record carries one):
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

// leaseWatcher is implemented by leases whose backend can tell their holder at once that
// the lease changed under it: its KV key or ZooKeeper node deleted, purged, or rewritten
// by someone else. Heartbeat.Run runs Watch when its lease has it, so the generator stops
// within milliseconds of the change instead of at the next renewal.
type leaseWatcher interface {
	// Watch watches the lease until ctx ends, then returns nil, or until the lease is
	// no longer this holder's. It reports through vouch, called from Watch's goroutine
	// (it must not block), as soon as it knows:
	//   - vouch(nil): it sees the lease is this holder's;
	//   - vouch(err), err wrapping ErrLeaseUnverified: it cannot see that for now (its
	//     connection dropped, its watch broke, the lease is missing but may yet be
	//     written again by Renew); the holder does not issue until the next vouch(nil);
	//   - vouch(err), err wrapping ErrLeaseLost: the lease is gone or someone else's;
	//     the holder stops for good, and Watch returns err once it has cleaned up.
	// Watch runs beside Renew, never twice at once for one lease, and ignores the
	// lease's own Release.
	Watch(ctx context.Context, vouch func(error)) error
}

// ErrLeaseLost is returned when this node's worker ID lease expired or was taken over:
// it must stop issuing snowflake IDs.
var ErrLeaseLost = errors.New("worker ID lease lost")

// ErrLeaseUnverified is the reason the generator is suspended while a lease's watch
// cannot see whether the lease is still this node's (leaseWatcher); it is lifted once the
// watch sees it is.
var ErrLeaseUnverified = errors.New("worker ID lease cannot be verified")

// ErrNoWorkerID is returned by Acquire when every worker ID in range is taken.
var ErrNoWorkerID = errors.New("no free worker ID")
