package dispenser

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/workerid"
)

// A node that loses its worker ID (its lease expired and was taken while it was paused,
// its ZooKeeper node was deleted, ...) stops issuing snowflake IDs at once: its
// heartbeat suspends the generator for good. It does not exit: the worker keeper acquires
// a new worker ID from the same registry, runs the clock guard for it as a start does,
// moves the generator to it (snowflake.Generator.Rebind, so the service and the pools
// keep the generator they hold) and starts a new heartbeat, whose first record resumes
// the generator. Segment IDs are served throughout. It gives up, and the dispenser exits
// saying why, only when taking a new ID cannot be done safely: the clock is behind the
// new ID's records, or another process runs under this node's identity.

// rejoinRetry spaces the attempts to acquire a new worker ID while the registry is
// unreachable or every ID is taken.
var rejoinRetry = backoff.Policy{Min: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}

// workerKeeper runs the heartbeat of the worker ID this node holds and, when the ID is
// lost, takes the next one. It stands where the heartbeat stood: Run, Beat and Stats.
type workerKeeper struct {
	d    *Dispenser
	held *heldLease

	mu       sync.Mutex
	hb       *workerid.Heartbeat
	rejoins  int       // worker IDs taken after the first
	lostAt   time.Time // when the last loss was seen; zero while none is being repaired
	lastLoss string
}

func newWorkerKeeper(d *Dispenser, held *heldLease, hb *workerid.Heartbeat) *workerKeeper {
	return &workerKeeper{d: d, held: held, hb: hb}
}

func (k *workerKeeper) current() *workerid.Heartbeat {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.hb
}

// Beat runs one beat of the current heartbeat.
func (k *workerKeeper) Beat(ctx context.Context) error { return k.current().Beat(ctx) }

// Stats is the current heartbeat's: while a new worker ID is being taken, the lost one's
// (lease lost, generator suspended).
func (k *workerKeeper) Stats() workerid.HeartbeatStats { return k.current().Stats() }

// Rejoins is how many worker IDs this node took after its first, and the reason for the
// last loss ("" when none).
func (k *workerKeeper) Rejoins() (int, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rejoins, k.lastLoss
}

// Run runs the heartbeat until ctx ends (the heartbeat's clean stop writes the last
// record and gives the ID back), and meanwhile the registry's own upkeep when it has
// one (a ZooKeeper client that stays without a session is replaced). After a lost
// worker ID it takes a new one and runs on; it returns an error only when that cannot be
// done safely.
func (k *workerKeeper) Run(ctx context.Context) error {
	stopUpkeep := k.startUpkeep()
	defer stopUpkeep() // after the heartbeat's clean stop, which may need the registry
	for {
		err := k.current().Run(ctx)
		if ctx.Err() != nil || !errors.Is(err, workerid.ErrLeaseLost) {
			return err
		}
		if err := k.rejoin(ctx, err); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while taking a new ID: nothing is held
			}
			return err
		}
	}
}

// startUpkeep runs the registry's Run (workerid.ZKRegistry has one) until the returned
// stop is called; stop waits for it.
func (k *workerKeeper) startUpkeep() (stop func()) {
	r, ok := k.d.registry.(interface{ Run(context.Context) error })
	if !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx) // returns nil when ctx ends
	}()
	return func() {
		cancel()
		<-done
	}
}

// rejoin takes a new worker ID after lost, retrying while the registry is unreachable or
// every ID is taken, until one serves or ctx ends. An error means it cannot be done
// safely; it says why.
func (k *workerKeeper) rejoin(ctx context.Context, lost error) error {
	log := k.d.log.With("component", "worker")
	old := k.held.WorkerID()
	k.mu.Lock()
	k.lostAt, k.lastLoss = time.Now(), lost.Error()
	k.mu.Unlock()
	log.Error("worker ID lost: snowflake IDs suspended while a new worker ID is taken (segment IDs are still served)",
		"worker_id", old, "err", lost)
	retry := backoff.New(rejoinRetry)
	for {
		err := k.takeNext(ctx)
		if err == nil {
			k.mu.Lock()
			k.rejoins++
			took := time.Since(k.lostAt)
			k.lostAt = time.Time{}
			k.mu.Unlock()
			log.Warn("serving snowflake IDs again with a new worker ID", "worker_id", k.held.WorkerID(), "lost_worker_id", old,
				"without_worker_id", took.Round(time.Millisecond))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable(err) {
			return fmt.Errorf("worker ID %d was lost (%v), and a new one cannot be taken safely: %w", old, lost, err)
		}
		wait := retry.Next()
		if retry.Failures() == 1 || retry.Failures()%10 == 0 {
			log.Warn("no new worker ID yet; trying again", "err", err, "in", wait.Round(time.Millisecond), "attempts", retry.Failures())
		}
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// takeNext acquires a worker ID, checks the clock against its records as a start does,
// moves the generator to it and writes its first record, which resumes the generator. A
// lease taken and not kept is given back.
func (k *workerKeeper) takeNext(ctx context.Context) error {
	d := k.d
	lease, err := d.registry.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a worker ID: %w", err)
	}
	hb, err := k.resumeWith(ctx, lease)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if rerr := lease.Release(rctx, lease.Recorded()); rerr != nil {
			d.log.Warn("give back a worker ID not kept", "worker_id", lease.WorkerID(), "err", rerr)
		}
		return err
	}
	k.held.set(lease)
	k.mu.Lock()
	k.hb = hb
	k.mu.Unlock()
	return nil
}

// resumeWith runs the clock guard for lease, rebinds the suspended generator to it and
// starts its heartbeat with a first beat.
func (k *workerKeeper) resumeWith(ctx context.Context, lease workerid.Lease) (*workerid.Heartbeat, error) {
	d := k.d
	guard, err := d.newGuard()
	if err != nil {
		return nil, err
	}
	floor, err := guard.Start(ctx, lease)
	if err != nil {
		return nil, fmt.Errorf("clock check for worker ID %d: %w", lease.WorkerID(), err)
	}
	hb, err := d.newHeartbeat(lease) // suspends the generator until its first record
	if err != nil {
		return nil, err
	}
	if err := d.snowflakes.Rebind(lease.WorkerID(), floor); err != nil {
		return nil, err
	}
	if err := hb.Beat(ctx); err != nil {
		return nil, fmt.Errorf("first heartbeat of worker ID %d: %w", lease.WorkerID(), err)
	}
	return hb, nil
}

// heldLease is the lease this node holds now, for whoever asks (the release at a failed
// start, the worker-ID metadata): the worker keeper replaces it after a loss.
type heldLease struct {
	mu    sync.Mutex
	lease workerid.Lease
}

var _ workerid.Lease = (*heldLease)(nil)

func (h *heldLease) get() workerid.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

func (h *heldLease) set(l workerid.Lease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lease = l
}

func (h *heldLease) WorkerID() int64    { return h.get().WorkerID() }
func (h *heldLease) Recorded() int64    { return h.get().Recorded() }
func (h *heldLease) TTL() time.Duration { return h.get().TTL() }

func (h *heldLease) Renew(ctx context.Context, ts int64) error   { return h.get().Renew(ctx, ts) }
func (h *heldLease) Release(ctx context.Context, ts int64) error { return h.get().Release(ctx, ts) }

// retryable tells a failure worth waiting out (a dependency not reachable yet, every
// worker ID taken for now) from one that says going on would be unsafe or the
// configuration is wrong, which no wait mends.
func retryable(err error) bool {
	for _, refusal := range []error{
		workerid.ErrInvalidConfig, workerid.ErrInvalidNodeID,
		workerid.ErrClockBehindRecord, workerid.ErrPeerSkew,
		workerid.ErrZKAddressInUse, workerid.ErrIdentityInUse,
		workerid.ErrZKSequenceOutOfRange, workerid.ErrWorkerIDOutOfRange,
		segment.ErrStoreWentBack, segment.ErrNoLeafAlloc, segment.ErrCorruptMarks,
		deployment.ErrMismatch, deployment.ErrCorrupt, ErrDataDirRestored,
		context.Canceled,
	} {
		if errors.Is(err, refusal) {
			return false
		}
	}
	return true
}

// workerStats is the worker keeper's part of $SRV.STATS: how many worker IDs this node
// took after its first, and why it lost the last.
func (d *Dispenser) workerStats() map[string]any {
	n, why := d.heartbeat.Rejoins()
	return map[string]any{"worker_id": d.lease.WorkerID(), "rejoins": n, "last_loss": why}
}
