package workerid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// ErrNotRecorded is the reason the generator is suspended from newHeartbeat until the
// first beat that records a timestamp where a restart (or the next holder of the ID) will
// read it; Beat also returns it (wrapped) when a beat recorded nothing that counts.
var ErrNotRecorded = errors.New("heartbeat record not written")

// ErrStopped is the reason the generator is suspended at a clean stop, and what Beat
// returns after Run has returned.
var ErrStopped = errors.New("heartbeat stopped")

// Heartbeat defaults.
const (
	DefaultClockJumpMax = time.Hour
	DefaultWriteTimeout = 2 * time.Second
	DefaultStopTimeout  = 5 * time.Second
	// DefaultCeilingLead is how far the ceiling reaches past a record's interval and
	// borrow-max (HeartbeatConfig.CeilingLead): long enough that a KV write stall of a
	// few seconds (an R3 stream electing a new leader takes 2-3 s) never reaches the
	// ceiling, short enough that a restart after kill -9, which waits out the last
	// ceiling, is back within seconds.
	DefaultCeilingLead = 4 * time.Second
)

// reclaimLogEvery is how often a stream of foreign writes to the worker record, each
// taken back at once, is logged: the first at once, then a count at most this often.
const reclaimLogEvery = 10 * time.Second

// Generator is the part of *snowflake.Generator the heartbeat drives.
type Generator interface {
	// Issued is the highest timestamp issued (Unix ms), possibly ahead of the clock.
	Issued() int64
	// SetCeiling forbids timestamps > ts.
	SetCeiling(ts int64)
	// Suspend makes the generator refuse with an error wrapping err until Resume.
	Suspend(err error)
	Resume()
}

var _ Generator = (*snowflake.Generator)(nil)

// Monotonic returns the time elapsed since some fixed point; unlike the wall clock it
// never steps. The heartbeat measures lease age and clock jumps with it.
type Monotonic func() time.Duration

// systemMonotonic is the process's monotonic clock (Go's monotonic time readings).
func systemMonotonic() Monotonic {
	start := time.Now()
	return func() time.Duration { return time.Since(start) }
}

// nonRecording is implemented by leases whose Renew stores the timestamp nowhere (the
// static registry): their Renew succeeding does not make the record durable.
type nonRecording interface{ recordsNothing() bool }

// HeartbeatConfig configures a Heartbeat. Start from DefaultHeartbeatConfig.
type HeartbeatConfig struct {
	// NodeID is this dispenser's key in the forever bucket. Required.
	NodeID string
	// Lease is the worker ID the generator uses. Required.
	Lease Lease
	// Generator is the snowflake generator for Lease's worker ID. Required.
	Generator Generator
	// Forever and Cache are where this node's record goes; either may be nil.
	Forever *Forever
	Cache   *CacheFile
	// Registry is the Identity of the registry that issued Lease, recorded in the cache
	// file so that no other registry ever starts from it (cacheEntry.Registry).
	Registry string
	// fence, set by the Keeper, writes the worker ID's record with a compare-and-set
	// (fence.go) instead of RaiseWorker: only its writes raise the ceiling, and a write
	// that finds someone else's record stops the generator for good.
	fence *workerFence
	// Clock is the generator's clock (snowflake.SystemClock()).
	Clock snowflake.Clock
	// Interval between beats (3 s) and BorrowMax (1 s): the ceiling is record + Interval
	// + BorrowMax, so both must be at most the Guard's values, and BorrowMax at least the
	// generator's. For an expiring lease, the lease TTL must be at least 4 Intervals.
	Interval  time.Duration
	BorrowMax time.Duration
	// CeilingLead is how much further the ceiling reaches (DefaultCeilingLead, 4 s): a
	// beat raises it to record + Interval + BorrowMax + CeilingLead, so that beats that
	// fail for up to BorrowMax + CeilingLead (a KV stream electing a leader) never stop
	// issuing. Every record carries its ceiling, so a restart, or the worker ID's next
	// holder, waits it out: the longer the lead, the longer a restart after kill -9 may
	// wait before its first snowflake ID. For an expiring lease it must be shorter than
	// TTL/2, where an unrenewed lease stops the generator anyway.
	CeilingLead time.Duration
	// ClockJumpMax is how far the wall clock may run ahead of where the monotonic clock
	// puts it before the record stops following it (1 h).
	ClockJumpMax time.Duration
	// Monotonic is the elapsed-time source (systemMonotonic()).
	Monotonic Monotonic
	// WriteTimeout bounds each write of a beat (2 s); StopTimeout bounds the final writes
	// and the release at a clean stop (5 s).
	WriteTimeout time.Duration
	StopTimeout  time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// DefaultHeartbeatConfig returns the defaults: the system clocks, Leaf's 3 s beat, 1 s of
// borrowing, forward clock jumps of up to 1 h followed, writes bounded by 2 s (5 s at
// the final stop). NodeID, Lease and Generator are left for the caller.
func DefaultHeartbeatConfig() HeartbeatConfig {
	return HeartbeatConfig{
		Clock:        snowflake.SystemClock(),
		Interval:     wire.HeartbeatInterval,
		BorrowMax:    DefaultBorrowMax,
		CeilingLead:  DefaultCeilingLead,
		ClockJumpMax: DefaultClockJumpMax,
		Monotonic:    systemMonotonic(),
		WriteTimeout: DefaultWriteTimeout,
		StopTimeout:  DefaultStopTimeout,
	}
}

// Validate reports the first setting that is missing or out of range, naming the field,
// its value and the bound; errors wrap ErrInvalidConfig or ErrInvalidNodeID.
func (c HeartbeatConfig) Validate() error {
	const component = "heartbeat"
	if err := CheckNodeID(c.NodeID); err != nil {
		return fmt.Errorf("%s: NodeID: %w", component, err)
	}
	switch {
	case c.Lease == nil:
		return invalid(component, "Lease is nil, want the lease of the generator's worker ID")
	case c.Generator == nil:
		return invalid(component, "Generator is nil, want the snowflake generator to drive")
	case c.Clock == nil:
		return invalid(component, "Clock is nil, want the generator's clock (snowflake.SystemClock() by default)")
	case c.Monotonic == nil:
		return invalid(component, "Monotonic is nil, want an elapsed-time source (systemMonotonic() by default)")
	}
	err := checkPositive(component,
		duration{"Interval", c.Interval}, duration{"BorrowMax", c.BorrowMax}, duration{"ClockJumpMax", c.ClockJumpMax},
		duration{"WriteTimeout", c.WriteTimeout}, duration{"StopTimeout", c.StopTimeout})
	if err != nil {
		return err
	}
	if c.CeilingLead < 0 {
		return invalid(component, "CeilingLead is %s, want >= 0 (%s by default)", c.CeilingLead, DefaultCeilingLead)
	}
	if ttl := c.Lease.TTL(); ttl > 0 && c.CeilingLead >= ttl/2 {
		return invalid(component, "CeilingLead %s is not shorter than half the lease TTL %s (%s): the generator stops at TTL/2 anyway; lengthen the TTL or shorten CeilingLead",
			c.CeilingLead, ttl, ttl/2)
	}
	if ttl := c.Lease.TTL(); ttl > 0 {
		if err := CheckLeaseTTL(ttl, c.Interval); err != nil {
			return invalid(component, "%v", err)
		}
	}
	return nil
}

// HeartbeatStats is a snapshot for monitoring ($SRV.STATS). Times are Unix ms.
type HeartbeatStats struct {
	WorkerID int64 `json:"worker_id"`
	// Record is the last timestamp recorded (attempted), Ceiling the generator's ceiling
	// (0 before the first successful beat).
	Record  int64 `json:"record"`
	Ceiling int64 `json:"ceiling"`
	// LastSuccess is the wall-clock time of the last beat that advanced the ceiling.
	LastSuccess         time.Time `json:"last_success,omitzero"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	Suspended           bool      `json:"suspended"`
	SuspendReason       string    `json:"suspend_reason,omitempty"`
	LeaseLost           bool      `json:"lease_lost"`
	// Reclaims counts the worker records found written by someone else (a forged or
	// stray write) that named no live holder and were taken back at once.
	Reclaims int `json:"reclaims"`
	// LeaseWatched is true while the lease's watch (leaseWatcher) last reported that it
	// sees the lease is this node's; false for a lease without a watch.
	LeaseWatched bool `json:"lease_watched"`
	// ClockMinusRecordMs is the clock minus Record at the last beat: negative while the
	// record is ahead (borrowed timestamps, or the clock stepped back).
	ClockMinusRecordMs int64 `json:"clock_minus_record_ms"`
	// ClockJumpMs is the wall clock minus where the monotonic clock says it should be.
	ClockJumpMs int64 `json:"clock_jump_ms"`
	// ForwardJumps counts jumps beyond ClockJumpMax; ForwardJumpActive is true while one
	// lasts (the record is capped meanwhile).
	ForwardJumps      int  `json:"forward_jumps"`
	ForwardJumpActive bool `json:"forward_jump_active"`
}

// Heartbeat keeps the record of the highest timestamp issued, in the forever bucket (under
// the node ID and under the worker ID), the cache file and the registry (Lease.Renew),
// every Interval (and again soon after a failed beat, backing off, so that a store that
// fails over within the ceiling's slack costs nothing), and keeps the generator within
// what those records vouch for:
//
//   - the record R is max(previous R, generator.Issued(), clock), the clock capped at
//     ClockJumpMax past where the monotonic clock puts it (a bad NTP step cannot poison
//     the record);
//   - after a beat that made R durable the generator's ceiling becomes R + Interval +
//     BorrowMax + CeilingLead, which is exactly what Guard.Start waits out at the next
//     start (every record carries that ceiling, so a start with a smaller BorrowMax
//     waits it out too). For a permanent ID (TTL 0) the worker ID's forever record or a recording
//     Renew counts, since every start with this worker ID reads both, whatever its node
//     ID (the cache file alone does not: only this node ID reads it); for an expiring
//     lease only Renew counts, since it is what extends the lease;
//   - an expiring lease not renewed for more than TTL/2 suspends the generator at once
//     (a timer, not the next beat) and a later renewal resumes it; a Renew that reports
//     ErrLeaseLost suspends it for good and Run returns that error;
//   - a lease that is a leaseWatcher is watched while Run runs: a change under the
//     holder (lease deleted or taken) suspends the generator for good at once and Run
//     returns ErrLeaseLost, and while the watch cannot see the lease the generator stays
//     suspended (ErrLeaseUnverified) until it can again;
//   - with the Keeper's fence (fence.go) the worker ID's record is written with a
//     compare-and-set, and only that write, with the node's own record before it (and
//     Renew, for an expiring lease), makes a beat count; a write that finds the record
//     rewritten by anyone else suspends the generator at once and reads the record
//     again: this run's own after all, or one that names no live holder and allows no
//     more than this holder's ceiling (a forged or stray write, workerFence.resolve), is
//     taken back at once and the generator resumed (counted in Stats().Reclaims, logged
//     at most once per 10 s); any other suspends it for good (ErrLeaseLost,
//     ErrWorkerIDInUse when another run holds it); the clean stop marks the record
//     released, keeping its ceiling.
//
// Several reasons to suspend may hold at once; the generator is resumed only when none
// does, and it reports the first of: lease lost, stopped, the beats' own (not recorded
// yet, not renewed for TTL/2), the watch's.
type Heartbeat struct {
	cfg      HeartbeatConfig
	log      *slog.Logger
	margin   int64 // Interval + BorrowMax + CeilingLead, ms
	durable  bool  // Renew success makes the record durable
	ttl      time.Duration
	kick     chan struct{}
	beatMu   sync.Mutex // one beat at a time (Lease.Renew is single-caller)
	anchorW  time.Time
	anchorM  time.Duration
	jumpMaxM int64

	mu          sync.Mutex
	record      int64
	base        int64 // highest record counted durable: the ceiling's base
	ceiling     int64
	lastOK      time.Duration // monotonic start of the last renewal that counted
	lastSuccess time.Time
	failures    int
	beats       int   // beats attempted
	suspendedBy error // the beats' reason: not recorded yet, or not renewed for TTL/2
	fenceErr    error // the fence's reason: its record moved, and whose it is now is being read
	watchErr    error // the lease watch's reason: it cannot see the lease
	watched     bool  // the lease watch's last report was that it sees the lease
	lostErr     error
	lost        chan struct{} // closed with lostErr set
	stopped     bool
	applied     error // the reason the generator was last given; nil: issuing
	clockMinus  int64
	jumpMs      int64
	jumps       int
	jumpActive  bool
	reclaims    int           // foreign writes to the worker record taken back
	reclaimLog  time.Duration // monotonic time of the last log of one; 0: never
	unlogged    int           // taken back since that log
}

// newHeartbeat validates cfg and returns a Heartbeat. It suspends the generator with
// ErrNotRecorded until the first successful beat sets its ceiling: the dispenser calls
// Beat once right after start-up, then Run.
func newHeartbeat(cfg HeartbeatConfig) (*Heartbeat, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	durable := true
	if nr, ok := cfg.Lease.(nonRecording); ok && nr.recordsNothing() {
		durable = false
	}
	h := &Heartbeat{
		cfg:      cfg,
		log:      cfg.Logger.With("node_id", cfg.NodeID, "worker_id", cfg.Lease.WorkerID()),
		margin:   (cfg.Interval + cfg.BorrowMax + cfg.CeilingLead).Milliseconds(),
		durable:  durable,
		ttl:      cfg.Lease.TTL(),
		kick:     make(chan struct{}, 1),
		anchorW:  cfg.Clock.Now(),
		anchorM:  cfg.Monotonic(),
		jumpMaxM: cfg.ClockJumpMax.Milliseconds(),
		lost:     make(chan struct{}),
	}
	h.lastOK = h.anchorM
	h.suspendedBy = fmt.Errorf("%w: waiting for the first heartbeat", ErrNotRecorded)
	h.applyLocked()
	return h, nil
}

// Beat runs one round: compute the record, write it to the forever bucket, the cache
// file and the lease, and raise the ceiling (resuming the generator if the heartbeat had
// suspended it) when the record became durable. It returns an error wrapping
// ErrNotRecorded when it did not, wrapping ErrLeaseLost when the ID is someone else's
// now, and ErrStopped after Run returned. Writes that failed while another counted are
// logged, not returned.
func (h *Heartbeat) Beat(ctx context.Context) error {
	h.beatMu.Lock()
	defer h.beatMu.Unlock()
	h.mu.Lock()
	lost, stopped := h.lostErr, h.stopped
	h.mu.Unlock()
	switch {
	case stopped:
		return ErrStopped
	case lost != nil:
		return lost
	}

	ts := h.nextRecord()
	h.mu.Lock()
	h.beats++
	h.mu.Unlock()
	var errs []error
	wrote, lostErr := h.writeOwn(ctx, ts, ts+h.margin, false, &errs)
	if lostErr != nil {
		h.loseLease(lostErr)
		return lostErr
	}

	renewStart := h.cfg.Monotonic()
	rctx, cancel := context.WithTimeout(ctx, h.cfg.WriteTimeout)
	err := h.cfg.Lease.Renew(rctx, ts)
	cancel()
	if errors.Is(err, ErrLeaseLost) {
		h.loseLease(err)
		return err
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("renew lease: %w", err))
	}

	counts := wrote || (err == nil && h.durable)
	switch {
	case h.cfg.fence != nil:
		// Only a fenced write may raise the ceiling: it is what any other holder of
		// the worker ID must see fail before this one issues past its record.
		counts = wrote && (h.ttl == 0 || err == nil)
	case h.ttl > 0:
		counts = err == nil
	}
	if !counts {
		return h.failed(ctx, ts, errs)
	}
	h.succeeded(ts, renewStart)
	if len(errs) > 0 {
		h.log.Warn("heartbeat: some record writes failed", "record", fmtMs(ts), "err", errors.Join(errs...))
	}
	return nil
}

// writeOwn writes the node's record and its worker ID's (WorkerKey) to the forever
// bucket and the node's to the cache file, each carrying the ceiling the record allows,
// and reports whether the worker ID's record was written: the one record of these that
// every later start with this worker ID reads, whatever its node ID or host. (A restart
// of this node reads all three, but the cache file and the node's key are not read by
// the same worker ID restarted under another node ID.) With a fence, released marks the
// worker ID's record released (a clean stop), and a lost is returned when the record
// turned out to be someone else's; the worker ID's record is not written after a loss.
func (h *Heartbeat) writeOwn(ctx context.Context, ts, ceiling int64, released bool, errs *[]error) (wrote bool, lost error) {
	id := h.cfg.Lease.WorkerID()
	if f := h.cfg.Forever; f != nil {
		wctx, cancel := context.WithTimeout(ctx, h.cfg.WriteTimeout)
		// The node's record first: a claimer of the worker ID takes its floor from every
		// record naming the worker ID, so this one keeps the ceiling even when the worker
		// record is rewritten under this holder. With the fence a beat counts only when
		// both were written.
		nodeErr := f.Put(wctx, h.cfg.NodeID, Record{WorkerID: id, Timestamp: ts, Ceiling: ceiling})
		if nodeErr != nil {
			*errs = append(*errs, nodeErr)
		}
		var err error
		skip := false
		switch {
		case h.cfg.fence != nil && nodeErr != nil && !released:
			skip = true // the ceiling is raised only once both records hold it
		case h.cfg.fence == nil:
			err = f.RaiseWorker(wctx, id, Record{WorkerID: id, Timestamp: ts, Ceiling: ceiling, NodeID: h.cfg.NodeID})
		case h.isLost():
			skip = true // the record is someone else's now
		default:
			err = h.writeFenced(wctx, ts, ceiling, released)
		}
		cancel()
		switch {
		case skip:
		case errors.Is(err, ErrLeaseLost):
			lost = err
		case err != nil:
			*errs = append(*errs, err)
		default:
			wrote = true
		}
	}
	if c := h.cfg.Cache; c != nil {
		e := cacheEntry{NodeID: h.cfg.NodeID, WorkerID: id, Timestamp: ts, Ceiling: ceiling, Owner: ownerOf(h.cfg.Lease), Registry: h.cfg.Registry}
		if fc := h.cfg.fence; fc != nil {
			e.Instance = fc.instance
		}
		if err := c.Save(e); err != nil {
			*errs = append(*errs, err)
		}
	}
	return wrote, lost
}

// writeFenced writes the worker ID's record through the fence. When someone else wrote
// it since, the generator is suspended at once, before the record is read again to
// decide from what it says (workerFence.resolve): this run's own (an earlier write went
// through although it seemed to fail), or a write that names no live holder and allows
// nothing past this holder's ceiling (a forged or stray write), and the record is taken
// back at once by compare-and-set, the generator issuing again as soon as that is
// written; or someone else holds the worker ID now, and an error wrapping ErrLeaseLost
// says who.
func (h *Heartbeat) writeFenced(ctx context.Context, ts, ceiling int64, released bool) error {
	const attempts = 3 // a record rewritten between each read and write: try again next beat
	var err error
	for range attempts {
		if err = h.cfg.fence.write(ctx, ts, ceiling, released); !errors.Is(err, errRecordMoved) {
			if err == nil {
				h.setFenceErr(nil)
			}
			return err
		}
		h.setFenceErr(fmt.Errorf("%w: %w", ErrLeaseUnverified, err))
		reclaim, rerr := h.cfg.fence.resolve(ctx)
		if rerr != nil {
			// Lost (Beat makes that for good), or not known yet: the generator stays
			// suspended until the record is read again at the next beat.
			return rerr
		}
		if reclaim == "" {
			h.log.Warn("the worker ID's record had moved, by an earlier write of this run's that seemed to fail; writing it again")
		} else {
			h.noteReclaim(reclaim)
		}
	}
	return err
}

// noteReclaim counts a foreign write taken back, and logs it: the first at once, then
// at most once per reclaimLogEvery with the count, so that a stream of them (a hostile
// writer) costs bounded log lines.
func (h *Heartbeat) noteReclaim(why string) {
	now := h.cfg.Monotonic()
	h.mu.Lock()
	h.reclaims++
	h.unlogged++
	n, total := h.unlogged, h.reclaims
	due := h.reclaimLog == 0 || now-h.reclaimLog >= reclaimLogEvery
	if due {
		h.reclaimLog, h.unlogged = max(now, 1), 0
	}
	h.mu.Unlock()
	if due {
		h.log.Warn("the worker ID's record was written by someone else, naming no live holder: taken back at once, issuing goes on (a forged or stray write to the forever bucket; check who may write it)",
			"why", why, "taken_back", n, "taken_back_total", total, "logged_at_most_every", reclaimLogEvery)
	}
}

// setFenceErr suspends the generator while the fence's record is being read again (err),
// or lifts that (nil).
func (h *Heartbeat) setFenceErr(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fenceErr = err
	h.applyLocked()
}

// isLost reports whether the lease was lost.
func (h *Heartbeat) isLost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lostErr != nil
}

// cacheOwner is implemented by leases that keep a token in the cache file (zk_leaf.go).
type cacheOwner interface{ cacheOwner() string }

// ownerOf is the token lease keeps in the cache file, "" for none.
func ownerOf(l Lease) string {
	if o, ok := l.(cacheOwner); ok {
		return o.cacheOwner()
	}
	return ""
}

// nextRecord computes the record for this beat and updates the clock statistics.
func (h *Heartbeat) nextRecord() int64 {
	issued := h.cfg.Generator.Issued()
	now := h.cfg.Clock.Now().UnixMilli()
	expected := h.anchorW.Add(h.cfg.Monotonic() - h.anchorM).UnixMilli()

	h.mu.Lock()
	defer h.mu.Unlock()
	clockTS := now
	if limit := expected + h.jumpMaxM; now > limit {
		clockTS = limit
		if !h.jumpActive {
			h.jumpActive = true
			h.jumps++
			h.log.Error("wall clock jumped forward beyond clock-jump-max: the record will not follow it; the generator stops at its ceiling until the clock is fixed and the dispenser restarted",
				"clock", fmtMs(now), "monotonic_now", fmtMs(expected), "jump", msDuration(now-expected), "clock_jump_max", h.cfg.ClockJumpMax)
		}
	} else if h.jumpActive {
		h.jumpActive = false
		h.log.Warn("wall clock back within clock-jump-max of the monotonic clock", "clock", fmtMs(now), "monotonic_now", fmtMs(expected))
	}
	ts := max(h.record, issued, clockTS)
	h.record = ts
	h.clockMinus = now - ts
	h.jumpMs = now - expected
	return ts
}

func (h *Heartbeat) succeeded(ts int64, renewStart time.Duration) {
	h.mu.Lock()
	if ts > h.base {
		h.base = ts
		h.ceiling = ts + h.margin
		h.cfg.Generator.SetCeiling(h.ceiling)
	}
	h.lastOK = renewStart
	first := h.lastSuccess.IsZero()
	h.lastSuccess = h.cfg.Clock.Now()
	if h.failures > 0 {
		h.log.Info("heartbeat recovered", "failed_beats", h.failures, "record", fmtMs(ts))
	}
	h.failures = 0
	if was := h.suspendedBy; was != nil {
		h.suspendedBy = nil
		switch resumed := h.applyLocked(); {
		case resumed && first:
			// The generator starts suspended until the first record is written: not news.
			h.log.Info("first heartbeat recorded: issuing", "record", fmtMs(ts), "ceiling", fmtMs(h.ceiling))
		case resumed:
			h.log.Warn("generator resumed", "was", was.Error(), "record", fmtMs(ts), "ceiling", fmtMs(h.ceiling))
		default:
			h.log.Warn("heartbeat recorded, but the generator stays suspended", "record", fmtMs(ts), "reason", h.applied)
		}
	}
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *Heartbeat) failed(ctx context.Context, ts int64, errs []error) error {
	err := fmt.Errorf("%w: record %s: %w", ErrNotRecorded, fmtMs(ts), errors.Join(errs...))
	if ctx.Err() != nil {
		return err // shutting down: not a failure of the stores
	}
	h.mu.Lock()
	h.failures++
	n, ceiling := h.failures, h.ceiling
	h.mu.Unlock()
	if n == 1 || n%10 == 0 { // failed beats are retried within a second: log the first, then every tenth
		h.log.Warn("heartbeat failed: the ceiling stays put", "consecutive_failures", n, "ceiling", fmtMs(ceiling), "err", err)
	}
	return err
}

// loseLease suspends the generator for good and makes Run return err. Only the first
// loss counts (the beat and the watch may both see it).
func (h *Heartbeat) loseLease(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lostErr != nil {
		return
	}
	h.lostErr = err
	h.applyLocked()
	close(h.lost)
	h.log.Error("worker ID lease lost: generator suspended for good on this worker ID (Run returns; a new ID must be taken)",
		"last_renewal", h.lastSuccess, "err", err)
}

// vouch is the lease watch's report (leaseWatcher.Watch): nil when it sees the lease is
// this node's, ErrLeaseLost when it is lost, any other error while it cannot see it.
func (h *Heartbeat) vouch(err error) {
	if errors.Is(err, ErrLeaseLost) {
		h.loseLease(err)
		return
	}
	if err != nil && !errors.Is(err, ErrLeaseUnverified) {
		err = fmt.Errorf("%w: %w", ErrLeaseUnverified, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.watchErr
	h.watchErr = err
	h.watched = err == nil
	switch {
	case was == nil && err != nil:
		h.log.Warn("the lease watch cannot see the worker ID lease: generator suspended until it can", "err", err)
	case was != nil && err == nil:
		h.log.Info("the lease watch sees the worker ID lease again", "was", was.Error())
	}
	h.applyLocked()
}

// applyLocked gives the generator the first reason to suspend that holds (see
// Heartbeat), or resumes it when none does; it reports whether it resumed it. h.mu is
// held.
func (h *Heartbeat) applyLocked() (resumed bool) {
	var reason error
	switch {
	case h.lostErr != nil:
		reason = h.lostErr
	case h.fenceErr != nil:
		reason = h.fenceErr
	case h.stopped:
		reason = ErrStopped
	case h.suspendedBy != nil:
		reason = h.suspendedBy
	default:
		reason = h.watchErr
	}
	if reason == h.applied {
		return false
	}
	was := h.applied
	h.applied = reason
	if reason != nil {
		h.cfg.Generator.Suspend(reason)
		return false
	}
	h.cfg.Generator.Resume()
	return was != nil
}

// expire suspends the generator when an expiring lease has gone more than TTL/2 without
// a renewal. It returns how long until the deadline should be checked again.
func (h *Heartbeat) expire() time.Duration {
	half := h.ttl / 2
	h.mu.Lock()
	defer h.mu.Unlock()
	since := h.cfg.Monotonic() - h.lastOK
	if since <= half {
		return half - since + time.Millisecond
	}
	if h.suspendedBy == nil && !h.stopped && h.lostErr == nil {
		h.suspendedBy = fmt.Errorf("%w: worker ID %d not renewed for %s (lease TTL %s, suspended at TTL/2)",
			ErrLeaseLost, h.cfg.Lease.WorkerID(), since.Round(time.Millisecond), h.ttl)
		h.applyLocked()
		h.log.Error("worker ID lease not renewed for over half its TTL: generator suspended",
			"since_last_renewal", since.Round(time.Millisecond), "ttl", h.ttl, "last_renewal", h.lastSuccess, "now", h.cfg.Clock.Now())
	}
	return half
}

// expiryTimer runs expire on a timer until done is closed; a successful beat re-arms it.
func (h *Heartbeat) expiryTimer(done <-chan struct{}) {
	t := time.NewTimer(h.expire())
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-h.kick:
		case <-t.C:
		}
		t.Reset(h.expire())
	}
}

// Run beats every Interval until ctx ends or the lease is lost, and meanwhile watches
// the lease when it is a leaseWatcher. It beats at once when Beat was never called, and
// after a failed beat tries again within a second (backing off) rather than a whole
// Interval later.
// When ctx ends it stops cleanly: suspend the generator (no more IDs), write the final
// record to the forever bucket and the cache file, then release the lease with it; it
// returns nil then (failed final writes are logged: they cannot endanger uniqueness, the
// ceiling never passed the last durable record's bound). After a lost lease (seen by a
// renewal or by the watch) it returns an error wrapping ErrLeaseLost at once, leaving
// the generator suspended. Run's goroutines have ended when it returns.
func (h *Heartbeat) Run(ctx context.Context) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	if h.ttl > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.expiryTimer(done)
		}()
	}
	stopWatch := h.startWatch()
	defer func() {
		stopWatch()
		close(done)
		wg.Wait()
	}()

	h.mu.Lock()
	beats := h.beats
	h.mu.Unlock()
	if beats == 0 {
		if err := h.Beat(ctx); errors.Is(err, ErrLeaseLost) {
			return err
		}
	}
	next := time.NewTimer(h.cfg.Interval)
	defer next.Stop()
	retry := backoff.New(beatRetry)
	for {
		select {
		case <-ctx.Done():
			stopWatch()     // first: the release deletes what it watches
			_ = h.stop(ctx) // failed final writes are logged: see above
			return nil
		case <-h.lost:
			h.mu.Lock()
			err := h.lostErr
			h.mu.Unlock()
			return err
		case <-next.C:
			err := h.Beat(ctx)
			switch {
			case errors.Is(err, ErrLeaseLost):
				return err
			case err != nil:
				// Soon again: the ceiling leaves BorrowMax of slack past the next beat.
				next.Reset(min(retry.Next(), h.cfg.Interval))
			default:
				retry.Reset()
				next.Reset(h.cfg.Interval)
			}
		}
	}
}

// beatRetry is how soon a failed beat is tried again: a KV bucket whose stream elects a
// new leader, or a ZooKeeper client that reconnects, is usually back within a second.
var beatRetry = backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}

// startWatch runs the lease's watch, when the lease has one, until the returned stop is
// called; stop waits for it to end and may be called again. A watch that ends by itself
// without reporting a loss is a bug in it; it counts as a loss, since nothing watches
// the lease any more.
func (h *Heartbeat) startWatch() (stop func()) {
	w, ok := h.cfg.Lease.(leaseWatcher)
	if !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		err := w.Watch(ctx, h.vouch)
		switch {
		case errors.Is(err, ErrLeaseLost):
		case ctx.Err() != nil:
			return
		default:
			err = fmt.Errorf("%w: the watch on worker ID %d ended by itself (%v)", ErrLeaseLost, h.cfg.Lease.WorkerID(), err)
		}
		h.loseLease(err)
	}()
	return func() {
		cancel()
		<-ended
	}
}

// stop is the clean stop: suspend, final record, release. It returns the writes that
// failed, which it also logs.
func (h *Heartbeat) stop(ctx context.Context) error {
	h.beatMu.Lock()
	defer h.beatMu.Unlock()
	h.mu.Lock()
	h.stopped = true
	lost := h.lostErr
	h.applyLocked()
	h.mu.Unlock()

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.StopTimeout)
	defer cancel()
	ts := h.nextRecord()
	var errs []error
	// The generator is suspended for good and ts covers all it issued: the records say
	// so (ceiling ts), and a restart need not wait past anything else; the fenced record
	// says it is released, so that the next holder need not wait to see this one gone.
	if _, lostNow := h.writeOwn(sctx, ts, ts, true, &errs); lostNow != nil {
		errs = append(errs, lostNow)
		lost = lostNow
	}
	if lost == nil { // a lost ID is someone else's: nothing to release
		if err := h.cfg.Lease.Release(sctx, ts); err != nil {
			errs = append(errs, fmt.Errorf("release lease: %w", err))
		}
	}
	if len(errs) > 0 {
		h.log.Warn("heartbeat stopped; some final writes failed", "record", fmtMs(ts), "err", errors.Join(errs...))
		return errors.Join(errs...)
	}
	h.log.Info("heartbeat stopped: final record written, lease released", "record", fmtMs(ts))
	return nil
}

// Stats returns a snapshot of the heartbeat's state.
func (h *Heartbeat) Stats() HeartbeatStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := HeartbeatStats{
		WorkerID:            h.cfg.Lease.WorkerID(),
		Record:              h.record,
		Ceiling:             h.ceiling,
		LastSuccess:         h.lastSuccess,
		ConsecutiveFailures: h.failures,
		Suspended:           h.applied != nil,
		LeaseLost:           h.lostErr != nil,
		LeaseWatched:        h.watched && h.lostErr == nil,
		Reclaims:            h.reclaims,
		ClockMinusRecordMs:  h.clockMinus,
		ClockJumpMs:         h.jumpMs,
		ForwardJumps:        h.jumps,
		ForwardJumpActive:   h.jumpActive,
	}
	if h.applied != nil {
		s.SuspendReason = h.applied.Error()
	}
	return s
}
