package workerid

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
)

// rebinder is the snowflake generator as the Keeper drives it (*snowflake.Generator):
// the heartbeat's Generator, plus moving it to another worker ID after a loss, so that
// everything holding the generator (the service, the pools) keeps it.
type rebinder interface {
	Generator
	// Rebind moves the suspended generator to workerID, issuing only above floor.
	Rebind(workerID, floor int64) error
	// WorkerID is the worker ID the generator's IDs carry now.
	WorkerID() int64
}

// KeeperConfig configures a Keeper.
type KeeperConfig struct {
	// Registry hands out the worker IDs. Required.
	Registry Registry
	// Guard is the clock guard's configuration, used for every worker ID this node takes
	// (a Guard is built from it for each). Its NodeID is required.
	Guard GuardConfig
	// Heartbeat is the heartbeat's configuration for every worker ID this node takes;
	// the Keeper fills in Lease, Generator and Registry (the Identity of Registry).
	Heartbeat HeartbeatConfig
	// Peers is the peers' worker-ID range check run beside the heartbeat; a nil Conn
	// turns it off.
	Peers PeersConfig
	// StaleAfter is how long another run's record of a worker ID may go unrewritten
	// before its writer counts as gone and this node may take the worker ID over
	// (fence.go): 0 is defaultStaleRecords record intervals (Heartbeat.Interval). A
	// record rewritten within it is a live holder's, and this node refuses the worker
	// ID. The fence needs Heartbeat.Forever; without it there is none. Heartbeat.Cache,
	// when set, must be this process's alone (the dispenser locks its data dir): the
	// record of the run it names is taken over at once.
	StaleAfter time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate reports the first setting that is missing; the guard's and heartbeat's own
// settings are checked when each is built.
func (c KeeperConfig) Validate() error {
	const component = "worker keeper"
	if c.Registry == nil {
		return invalid(component, "Registry is nil, want the registry worker IDs come from")
	}
	if err := CheckNodeID(c.Guard.NodeID); err != nil {
		return fmt.Errorf("%s: Guard.NodeID: %w", component, err)
	}
	if c.StaleAfter < 0 {
		return invalid(component, "StaleAfter is %s, want >= 0 (0: %d record intervals)", c.StaleAfter, defaultStaleRecords)
	}
	if c.Heartbeat.StopTimeout <= 0 {
		return invalid(component, "Heartbeat.StopTimeout is %s, want > 0: it also bounds giving back a worker ID not kept", c.Heartbeat.StopTimeout)
	}
	return c.Peers.validate()
}

// rejoinRetry spaces the attempts to acquire a new worker ID while the registry is
// unreachable or every ID is taken.
var rejoinRetry = backoff.Policy{Min: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}

// Keeper is this node's worker identity, as one actor: it acquires the worker ID from
// the Registry (Acquire), checks the clock for it (CheckClock: the Guard), starts its
// Heartbeat on the generator (Start), and then, in Run, keeps it: the heartbeat, the
// registry's own upkeep (a ZooKeeper client without a session is replaced), and the
// peers' range check; when the worker ID is lost (its lease expired and was taken while
// this process was paused, its ZooKeeper node deleted, ...) the heartbeat suspends the
// generator for good and the Keeper takes a new one from the same registry, checks the
// clock for it as a start does, moves the generator to it (Rebind) and starts its
// heartbeat, whose first record resumes the generator. It gives up, and Run returns an
// error saying why, only when taking a new ID cannot be done safely (IsRefusal): the
// clock is behind the new ID's records, or another process runs under this node's
// identity.
//
// Whatever the registry, it also fences the worker ID (fence.go): before serving with
// it, it claims the worker ID's record in the forever bucket, refusing the ID when
// another live dispenser holds it (ErrWorkerIDInUse), and the heartbeat writes that
// record with a compare-and-set, so that a write by anyone else stops this node at once.
//
// Acquire, CheckClock and Start run once each, in this order, before Run; Release gives
// the worker ID back when Run never ran (a failed start). The other methods are safe
// for concurrent use.
type Keeper struct {
	cfg      KeeperConfig
	log      *slog.Logger
	peers    *peerRanges
	instance string // this run's token in its worker records (fence.go)

	mu       sync.Mutex
	lease    Lease
	fence    *workerFence // the lease's worker record; nil without a forever bucket
	floor    int64
	gen      rebinder
	hb       *Heartbeat
	ran      bool      // Run was called: its clean stop releases the lease, or it was lost
	rejoins  int       // worker IDs taken after the first
	lostAt   time.Time // when the last loss was seen; zero while none is being repaired
	lastLoss string
}

// NewKeeper validates cfg and returns a Keeper that holds no worker ID yet.
func NewKeeper(cfg KeeperConfig) (*Keeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	k := &Keeper{cfg: cfg, log: cfg.Logger, instance: rand.Text()}
	k.peers = newPeerRanges(cfg.Peers, cfg.Guard.NodeID, k.currentWorkerID, cfg.Logger.With("component", "peer-ranges"))
	return k, nil
}

// Acquire claims this node's worker ID from the registry.
func (k *Keeper) Acquire(ctx context.Context) error {
	lease, err := k.cfg.Registry.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a worker ID: %w", err)
	}
	k.mu.Lock()
	k.lease = lease
	k.mu.Unlock()
	k.log.Info("worker ID acquired", "worker_id", lease.WorkerID(), "recorded", lease.Recorded())
	return nil
}

// CheckClock claims the worker ID's record (fence.go: it refuses an ID another live
// dispenser holds, with an error wrapping ErrWorkerIDInUse, and may wait a few record
// intervals to see whether the record's writer is alive) and decides whether this node's
// clock may be trusted with it (Guard.Start): it refuses a clock behind the records,
// checks a first start against the peers, and waits past the floor, which it returns:
// the generator must issue only above it.
func (k *Keeper) CheckClock(ctx context.Context) (floor int64, err error) {
	lease := k.Lease()
	if lease == nil {
		return 0, errors.New("worker keeper: CheckClock before Acquire")
	}
	fence, floor, err := k.claimAndGuard(ctx, lease)
	if err != nil {
		return 0, err
	}
	k.mu.Lock()
	k.fence, k.floor = fence, floor
	k.mu.Unlock()
	return floor, nil
}

// claimAndGuard claims lease's worker record and then runs the clock guard, which reads
// the record claimed: the heartbeat's first write, a compare-and-set on the claimed
// revision, fails if anyone wrote it in between.
func (k *Keeper) claimAndGuard(ctx context.Context, lease Lease) (*workerFence, int64, error) {
	fence, err := k.claim(ctx, lease.WorkerID())
	if err != nil {
		return nil, 0, err // it names the worker ID
	}
	guard, err := newGuard(k.cfg.Guard)
	if err != nil {
		return nil, 0, err
	}
	floor, err := guard.Start(ctx, lease)
	if err != nil {
		return nil, 0, fmt.Errorf("clock check for worker ID %d: %w", lease.WorkerID(), err)
	}
	return fence, floor, nil
}

// claim claims worker ID id's record; nil without a forever bucket.
func (k *Keeper) claim(ctx context.Context, id int64) (*workerFence, error) {
	hb := k.cfg.Heartbeat
	if hb.Forever == nil {
		return nil, nil
	}
	stale := k.cfg.StaleAfter
	if stale == 0 {
		stale = defaultStaleRecords * hb.Interval
	}
	c := claimer{
		forever: hb.Forever, nodeID: hb.NodeID, instance: k.instance, cache: hb.Cache,
		staleAfter: stale, poll: min(max(hb.Interval/4, 10*time.Millisecond), 250*time.Millisecond),
		log: k.log,
	}
	return c.claim(ctx, id)
}

// Start builds the heartbeat of the worker ID on gen (built with WorkerID and the floor
// CheckClock returned) and writes its first record before serving, so the generator has
// a ceiling. When someone wrote the worker ID's record since CheckClock claimed it, it
// claims it again, as CheckClock does (refusing with an error wrapping ErrWorkerIDInUse
// when a live dispenser holds it), and moves gen past the new floor.
func (k *Keeper) Start(ctx context.Context, gen rebinder) error {
	lease := k.Lease()
	if lease == nil {
		return errors.New("worker keeper: Start before Acquire")
	}
	k.mu.Lock()
	k.gen = gen
	fence := k.fence
	k.mu.Unlock()
	hb, fence, floor, err := k.firstBeat(ctx, lease, fence, gen)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.hb, k.fence = hb, fence
	if floor > 0 {
		k.floor = floor
	}
	k.mu.Unlock()
	return nil
}

// firstBeat starts the heartbeat of lease on gen with a first beat. The first write of a
// claimed record may find it rewritten since the claim: by a live holder (two dispensers
// racing to start on one worker ID), or by a holder that was only paused, writing once
// more before it finds its lease lost and releases the record. Telling these apart takes
// watching the record, so it claims the record again (which watches it when it must),
// checks the clock again and moves gen past the new floor (0 when it did not).
func (k *Keeper) firstBeat(ctx context.Context, lease Lease, fence *workerFence, gen rebinder) (*Heartbeat, *workerFence, int64, error) {
	var floor int64
	for attempt := 1; ; attempt++ {
		hb, err := k.newHeartbeat(lease, fence) // suspends the generator until its first record
		if err != nil {
			return nil, nil, 0, err
		}
		err = hb.Beat(ctx)
		if err == nil {
			return hb, fence, floor, nil
		}
		if attempt >= 3 || !isFenceLost(err) {
			return nil, nil, 0, fmt.Errorf("first heartbeat of worker ID %d: %w", lease.WorkerID(), err)
		}
		k.log.Warn("the worker ID's record was written by another run since this node claimed it; claiming it again", "worker_id", lease.WorkerID(), "err", err)
		if fence, floor, err = k.claimAndGuard(ctx, lease); err != nil {
			return nil, nil, 0, err
		}
		if err := gen.Rebind(lease.WorkerID(), floor); err != nil {
			return nil, nil, 0, err
		}
	}
}

// newHeartbeat builds the heartbeat of lease, writing its worker record through fence,
// which suspends the generator until its first record is written.
func (k *Keeper) newHeartbeat(lease Lease, fence *workerFence) (*Heartbeat, error) {
	cfg := k.cfg.Heartbeat
	cfg.Lease = lease
	cfg.fence = fence
	cfg.Generator = k.generator()
	if id, ok := k.cfg.Registry.(Identifier); ok {
		cfg.Registry = id.Identity()
	}
	return newHeartbeat(cfg)
}

// Lease is the lease this node holds now (nil before Acquire); after a loss, the new one
// once it serves.
func (k *Keeper) Lease() Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease
}

// WorkerID is the worker ID this node holds now, -1 before Acquire.
func (k *Keeper) WorkerID() int64 {
	if l := k.Lease(); l != nil {
		return l.WorkerID()
	}
	return -1
}

func (k *Keeper) generator() rebinder {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen
}

func (k *Keeper) heartbeat() *Heartbeat {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.hb
}

// currentWorkerID is the worker ID the generator's IDs carry (the held one before Start).
func (k *Keeper) currentWorkerID() int64 {
	if g := k.generator(); g != nil {
		return g.WorkerID()
	}
	return k.WorkerID()
}

// Stats is the current heartbeat's: while a new worker ID is being taken, the lost one's
// (lease lost, generator suspended). Before Start it is empty.
func (k *Keeper) Stats() HeartbeatStats {
	if hb := k.heartbeat(); hb != nil {
		return hb.Stats()
	}
	return HeartbeatStats{}
}

// Rejoins is how many worker IDs this node took after its first, and the reason for the
// last loss ("" when none).
func (k *Keeper) Rejoins() (int, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rejoins, k.lastLoss
}

// PeerConflicts is how many peers' worker IDs or ranges conflicted with this node's at
// the peer check's last look.
func (k *Keeper) PeerConflicts() int64 { return k.peers.conflicts.Load() }

// PeerChecks is how many times the peer check has looked at its peers since the start.
func (k *Keeper) PeerChecks() int64 { return k.peers.checks.Load() }

// Run runs the heartbeat until ctx ends (the heartbeat's clean stop writes the last
// record and gives the ID back), and meanwhile the registry's own upkeep when it has one
// and the peers' range check. After a lost worker ID it takes a new one and runs on; it
// returns an error only when that cannot be done safely. Run may be called once, after
// Start; its goroutines have ended when it returns.
func (k *Keeper) Run(ctx context.Context) error {
	k.mu.Lock()
	k.ran = true
	k.mu.Unlock()
	stopUpkeep := k.startUpkeep()
	defer stopUpkeep() // after the heartbeat's clean stop, which may need the registry
	stopPeers := k.peers.start()
	defer stopPeers()
	for {
		err := k.heartbeat().Run(ctx)
		if ctx.Err() != nil || !errors.Is(err, ErrLeaseLost) {
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

// startUpkeep runs the registry's Run (ZKRegistry has one) until the returned stop is
// called; stop waits for it.
func (k *Keeper) startUpkeep() (stop func()) {
	r, ok := k.cfg.Registry.(interface{ Run(context.Context) error })
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
func (k *Keeper) rejoin(ctx context.Context, lost error) error {
	log := k.log.With("component", "worker")
	old := k.WorkerID()
	k.mu.Lock()
	k.lostAt, k.lastLoss = time.Now(), lost.Error()
	fence := k.fence
	k.mu.Unlock()
	log.Error("worker ID lost: snowflake IDs suspended while a new worker ID is taken (segment IDs are still served)",
		"worker_id", old, "err", lost)
	if fence != nil && !isFenceLost(lost) {
		// Lost otherwise (its lease): say so in its record, which is still this run's,
		// so that its next holder need not wait to see this one gone.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.Heartbeat.StopTimeout)
		if err := fence.release(rctx); err != nil {
			log.Warn("could not mark the lost worker ID's record released; its next holder waits to see it unwritten", "worker_id", old, "err", err)
		}
		cancel()
	}
	retry := backoff.New(rejoinRetry)
	for {
		err := k.takeNext(ctx)
		if err == nil {
			k.mu.Lock()
			k.rejoins++
			took := time.Since(k.lostAt)
			k.lostAt = time.Time{}
			k.mu.Unlock()
			log.Warn("serving snowflake IDs again with a new worker ID", "worker_id", k.WorkerID(), "lost_worker_id", old,
				"without_worker_id", took.Round(time.Millisecond))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if IsRefusal(err) {
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
func (k *Keeper) takeNext(ctx context.Context) error {
	lease, err := k.cfg.Registry.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a worker ID: %w", err)
	}
	hb, fence, err := k.resumeWith(ctx, lease)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.Heartbeat.StopTimeout)
		defer cancel()
		if rerr := lease.Release(rctx, lease.Recorded()); rerr != nil {
			k.log.Warn("give back a worker ID not kept", "worker_id", lease.WorkerID(), "err", rerr)
		}
		return err
	}
	k.mu.Lock()
	k.lease, k.hb, k.fence = lease, hb, fence
	k.mu.Unlock()
	return nil
}

// resumeWith claims lease's worker record, runs the clock guard for it, rebinds the
// suspended generator to it and starts its heartbeat with a first beat.
func (k *Keeper) resumeWith(ctx context.Context, lease Lease) (*Heartbeat, *workerFence, error) {
	fence, floor, err := k.claimAndGuard(ctx, lease)
	if err != nil {
		return nil, nil, err
	}
	gen := k.generator()
	if err := gen.Rebind(lease.WorkerID(), floor); err != nil {
		return nil, nil, err
	}
	hb, fence, again, err := k.firstBeat(ctx, lease, fence, gen)
	if err != nil {
		return nil, nil, err
	}
	k.mu.Lock()
	k.floor = max(floor, again)
	k.mu.Unlock()
	return hb, fence, nil
}

// Release gives the worker ID back when Run has not (Run's clean stop does): after a
// failed start, or when Run never ran. It records the highest timestamp issued, if any
// (a service may serve before Run): the generator is suspended first, so that stays the
// highest, and a generator that issued nothing reports its floor, which is no timestamp
// it used. With nothing issued the record stays the registry's own. The worker ID's
// record in the forever bucket is marked released, so that the next holder need not wait
// to see it unwritten. Once Start has run, that is the heartbeat's clean stop. Without a
// worker ID it does nothing.
func (k *Keeper) Release(ctx context.Context) error {
	k.mu.Lock()
	ran, lease, gen, floor, fence, hb := k.ran, k.lease, k.gen, k.floor, k.fence, k.hb
	k.mu.Unlock()
	if ran || lease == nil {
		return nil // the heartbeat released it with its final record, or lost it
	}
	if hb != nil {
		// Started, never run: the heartbeat's own clean stop, as Run's would be, so that
		// the records and the cache file say so (this data dir's next run need not wait
		// out the released record's ceiling).
		return hb.stop(ctx)
	}
	ts := lease.Recorded()
	if gen != nil {
		gen.Suspend(ErrStopped)
		if issued := gen.Issued(); issued > floor {
			ts = max(ts, issued)
		}
	}
	var errs []error
	if err := lease.Release(ctx, ts); err != nil {
		errs = append(errs, fmt.Errorf("worker ID %d: %w", lease.WorkerID(), err))
	}
	// The record keeps the ceiling the last beat allowed, which covers what was issued.
	if fence != nil {
		if err := fence.release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("mark worker ID %d's record released: %w", lease.WorkerID(), err))
		}
	}
	return errors.Join(errs...)
}

// IsRefusal reports whether err (from Acquire, the clock guard or a heartbeat) says going
// on would be unsafe or the configuration is wrong, which no wait mends, rather than a
// dependency not reachable yet or every worker ID taken for now.
func IsRefusal(err error) bool {
	for _, refusal := range []error{
		ErrInvalidConfig, ErrInvalidNodeID,
		ErrClockBehindRecord, ErrPeerSkew,
		ErrZKAddressInUse, ErrIdentityInUse,
		ErrZKSequenceOutOfRange, ErrWorkerIDOutOfRange,
		ErrWorkerIDInUse, ErrCorruptCacheFile, ErrPeerLayout,
		context.Canceled,
	} {
		if errors.Is(err, refusal) {
			return true
		}
	}
	return false
}
