package workerid

import (
	"context"
	"fmt"
	"time"
)

// StaticRegistry hands out one worker ID fixed by the operator (--worker-id). The ID is
// held for good and nothing is stored anywhere: the operator guarantees that no two nodes
// share it, and this node's own records (the forever bucket and the cache file) are what
// protect its timestamps across restarts.
type StaticRegistry struct {
	workerID int64
}

var (
	_ Registry   = (*StaticRegistry)(nil)
	_ Identifier = (*StaticRegistry)(nil)
)

// NewStaticRegistry returns a registry that always hands out workerID, which must be in
// 0..maxWorkerID (the layout's bound, 1023 by default). Errors wrap ErrInvalidConfig.
func NewStaticRegistry(workerID, maxWorkerID int64) (*StaticRegistry, error) {
	if maxWorkerID < 0 {
		return nil, fmt.Errorf("%w: max worker ID %d is negative", ErrInvalidConfig, maxWorkerID)
	}
	if workerID < 0 || workerID > maxWorkerID {
		return nil, fmt.Errorf("%w: worker ID %d is outside 0..%d", ErrInvalidConfig, workerID, maxWorkerID)
	}
	return &StaticRegistry{workerID: workerID}, nil
}

// NewStaticRegistryInRange is NewStaticRegistry for a deployment restricted to rng
// (--worker-id-min, --worker-id-max): a workerID outside it is refused with an error
// wrapping ErrInvalidConfig and ErrWorkerIDOutOfRange.
func NewStaticRegistryInRange(workerID int64, rng Range) (*StaticRegistry, error) {
	if err := rng.check("static registry"); err != nil {
		return nil, err
	}
	if !rng.Contains(workerID) {
		return nil, fmt.Errorf("%w: %w: --worker-id %d is outside this deployment's %s",
			ErrInvalidConfig, ErrWorkerIDOutOfRange, workerID, rng.describe())
	}
	return &StaticRegistry{workerID: workerID}, nil
}

// Identity is "static": every static registry hands out what its operator said.
func (r *StaticRegistry) Identity() string { return "static" }

// Acquire returns the configured ID at once.
func (r *StaticRegistry) Acquire(ctx context.Context) (Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("acquire static worker ID %d: %w", r.workerID, err)
	}
	return staticLease{workerID: r.workerID}, nil
}

// staticLease is permanent and records nothing: Renew and Release succeed without doing
// anything, which is why it tells the heartbeat so (recordsNothing).
type staticLease struct {
	workerID int64
}

var _ Lease = staticLease{}

func (l staticLease) WorkerID() int64                             { return l.workerID }
func (l staticLease) Recorded() int64                             { return 0 }
func (l staticLease) TTL() time.Duration                          { return 0 }
func (l staticLease) Renew(ctx context.Context, ts int64) error   { return nil }
func (l staticLease) Release(ctx context.Context, ts int64) error { return nil }
func (l staticLease) recordsNothing() bool                        { return true }
