package snowflake

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Generator. Times are Unix milliseconds, like the timestamps in IDs.
type Config struct {
	// Layout is the bit layout; the zero Layout means DefaultLayout().
	Layout Layout
	// WorkerID is this generator's worker, 0 to Layout.MaxWorkerID(). Two generators with the
	// same worker ID and layout repeat each other's IDs: whoever assigns it must make sure
	// only one process holds it at a time.
	WorkerID int64
	// Clock is read for every call; nil means SystemClock().
	Clock Clock
	// DenseSequence starts each new millisecond's sequence at 0. False, as in Leaf, starts it
	// at a random 0 to 99 (fewer for layouts with under 8 sequence bits: at most half the
	// millisecond is skipped), so that IDs of a lightly loaded worker do not all end in 0.
	DenseSequence bool
	// Floor is a timestamp that may already have been used with this worker ID (by an earlier
	// run or an earlier holder of the ID): no timestamp <= Floor is ever issued, and calls are
	// refused with ErrClockBackwards until the clock passes it. 0 means none. It must be
	// below Layout.MaxTimestamp(). Waiting out the floor at start-up is the caller's job.
	Floor int64
	// MaxBackwardWait is the largest backwards step of the clock that is waited out, by
	// sleeping twice its size (as Leaf does; unlike Leaf, without holding the generator's
	// lock, so other calls go on meanwhile); larger steps are refused with ErrClockBackwards. Each call measures the step afresh, so refusals
	// last until the clock is back within MaxBackwardWait of its highest reading, and the
	// rest is waited out. 0 means 5ms; at most 1s. Steps are whole milliseconds, so a value
	// under 1ms refuses every step.
	MaxBackwardWait time.Duration
	// BorrowMax is how far ahead of the clock the generator may move when a millisecond's
	// sequence is spent, instead of waiting for the clock (whole milliseconds count). 0, as in
	// Leaf, always waits. Borrowing lets pre-filled batches be cut at once; the ceiling still
	// bounds it, and Issued reports the borrowed timestamp so heartbeats can record it.
	BorrowMax time.Duration
	// Rand returns a random int in [0, n) for the sequence's start; nil means
	// math/rand/v2.IntN. Values out of range are taken as 0. It is called with the
	// generator's lock held, so it need not be safe for concurrent use.
	Rand func(n int) int
}

// Stats is a snapshot of a Generator, for monitoring.
type Stats struct {
	Issued   int64         // as Issued()
	Borrowed time.Duration // how far Issued is ahead of the clock now (0 when not)
	Offset   time.Duration // how far the clock is behind the last clock reading seen (0 when not)
	Refused  uint64        // calls of Next and Fill refused (any error) since New
}

// Generator issues the IDs of one worker. Its methods are safe for concurrent use.
type Generator struct {
	// Fixed by New, except worker, workerPart, floor and lowest, which Rebind changes
	// with mu held (and which are read with mu held).
	layout      Layout
	worker      int64
	clock       Clock
	dense       bool
	rand        func(n int) int
	startN      int   // bound of the random sequence start; <= 1 means always 0
	floor       int64 // Config.Floor
	lowest      int64 // max(Floor, Epoch): every timestamp issued is above it, so every ID is > 0
	maxTS       int64
	maxSeq      int64
	maxBack     int64         // MaxBackwardWait in whole ms
	maxBackWait time.Duration // MaxBackwardWait as given, for messages
	borrow      int64         // BorrowMax in whole ms
	timeShift   int
	workerPart  int64 // worker ID shifted into place

	// Read on every call without the lock: changing them must not wait for a slow Next.
	ceiling   atomic.Int64
	suspended atomic.Pointer[suspension]
	refused   atomic.Uint64

	mu   sync.Mutex
	last int64 // highest timestamp issued; Floor before the first
	seq  int64 // highest sequence issued at last
	seen int64 // highest clock reading, Unix ms
}

// suspension boxes the error Suspend was given, so that it can be swapped atomically.
type suspension struct{ err error }

const (
	// DefaultMaxBackwardWait is the clock step back that Fill waits out (twice it, as Leaf
	// does) rather than refusing: Config.MaxBackwardWait when zero.
	DefaultMaxBackwardWait = 5 * time.Millisecond
	// maxBackwardWaitLimit bounds MaxBackwardWait because the wait (twice the step) stalls
	// every caller that meets the step, and the NATS service calls on its delivery goroutine.
	maxBackwardWaitLimit = time.Second
	// randomStart is Leaf's bound for the random sequence start.
	randomStart = 100
)

// New returns a generator for cfg, or an error wrapping ErrInvalidConfig that names the field,
// its value and the bound.
func New(cfg Config) (*Generator, error) {
	l := cfg.Layout
	if l == (Layout{}) {
		l = DefaultLayout()
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if cfg.WorkerID < 0 || cfg.WorkerID > l.MaxWorkerID() {
		return nil, fmt.Errorf("%w: WorkerID is %d, must be 0 to %d with %d worker bits",
			ErrInvalidConfig, cfg.WorkerID, l.MaxWorkerID(), l.WorkerBits)
	}
	if cfg.MaxBackwardWait < 0 || cfg.MaxBackwardWait > maxBackwardWaitLimit {
		return nil, fmt.Errorf("%w: MaxBackwardWait is %v, must be 0 to %v",
			ErrInvalidConfig, cfg.MaxBackwardWait, maxBackwardWaitLimit)
	}
	if cfg.BorrowMax < 0 {
		return nil, fmt.Errorf("%w: BorrowMax is %v, must be at least 0", ErrInvalidConfig, cfg.BorrowMax)
	}
	if cfg.Floor < 0 || cfg.Floor >= l.MaxTimestamp() {
		return nil, fmt.Errorf("%w: Floor is %d, must be 0 to %d (below the layout's last timestamp, %s)",
			ErrInvalidConfig, cfg.Floor, l.MaxTimestamp()-1, time.UnixMilli(l.MaxTimestamp()).UTC().Format(time.RFC3339Nano))
	}

	g := &Generator{
		layout:      l,
		worker:      cfg.WorkerID,
		clock:       cfg.Clock,
		dense:       cfg.DenseSequence,
		rand:        cfg.Rand,
		startN:      int(min(randomStart, (l.MaxSequence()+1)/2)),
		floor:       cfg.Floor,
		lowest:      max(cfg.Floor, l.Epoch),
		maxTS:       l.MaxTimestamp(),
		maxSeq:      l.MaxSequence(),
		maxBackWait: cfg.MaxBackwardWait,
		borrow:      int64(cfg.BorrowMax / time.Millisecond),
		timeShift:   l.WorkerBits + l.SequenceBits,
		workerPart:  cfg.WorkerID << l.SequenceBits,
		last:        cfg.Floor,
		seen:        math.MinInt64,
	}
	if g.clock == nil {
		g.clock = SystemClock()
	}
	if g.rand == nil {
		g.rand = rand.IntN
	}
	if g.maxBackWait == 0 {
		g.maxBackWait = DefaultMaxBackwardWait
	}
	g.maxBack = int64(g.maxBackWait / time.Millisecond)
	return g, nil
}

// Next returns a new ID, greater than every ID this generator returned before. It may wait
// for the next millisecond when this one's sequence is spent, or for twice a small
// backwards step of the clock; it does not hold the generator's lock while it waits, so
// calls that need no wait go on meanwhile. Errors wrap ErrClockBackwards,
// ErrTimestampOverflow, ErrCeiling or, while suspended, ErrSuspended and the reason.
func (g *Generator) Next() (int64, error) {
	var a attempt
	g.mu.Lock()
	ts, seq, _, err := g.takeRun(1, &a)
	worker := g.workerPart // Rebind may change it once the lock is released
	g.mu.Unlock()
	if err != nil {
		g.refused.Add(1)
		return 0, err
	}
	return (ts-g.layout.Epoch)<<g.timeShift | worker | seq, nil
}

// Fill puts len(dst) new IDs into dst, strictly increasing and greater than every ID issued
// before, spanning as many milliseconds as needed. It is all or nothing: on error dst is
// zeroed and the IDs already taken for it are skipped for good (a gap, never a repeat).
// Errors and waits are Next's; while a Fill waits, other calls may take IDs, so a batch
// that spans milliseconds need not be one unbroken run.
func (g *Generator) Fill(dst []int64) error {
	if len(dst) == 0 {
		return nil
	}
	var a attempt
	g.mu.Lock()
	for i := 0; i < len(dst); {
		ts, seq, n, err := g.takeRun(len(dst)-i, &a)
		if err != nil {
			g.mu.Unlock()
			g.refused.Add(1)
			clear(dst)
			return err
		}
		// The sequence run stays within one millisecond, so adding never carries into the
		// worker bits.
		base := (ts-g.layout.Epoch)<<g.timeShift | g.workerPart | seq
		for k := range n {
			dst[i+k] = base + int64(k)
		}
		i += n
	}
	g.mu.Unlock()
	return nil
}

// attempt is what one call of Next or Fill carries between its tries: the wait its last
// try asked for, and the backwards step being waited out, if any.
type attempt struct {
	wait     time.Duration // > 0: sleep this long, without the lock, then try again
	back     int64         // ms of the step being slept out
	backWait time.Duration // how long; 0 when no step is being waited out
}

// takeRun is take, tried again after every wait it asks for. g.mu is held on entry and on
// return but released during each sleep, so that a call waiting for the next millisecond
// or for the clock to come back never holds up the others; each try starts afresh from the
// generator's state, which they may have moved on meanwhile.
func (g *Generator) takeRun(want int, a *attempt) (ts, seq int64, n int, err error) {
	for {
		ts, seq, n, err = g.take(want, a)
		if err != nil || a.wait <= 0 {
			return ts, seq, n, err
		}
		wait := a.wait
		a.wait = 0
		g.mu.Unlock()
		g.clock.Sleep(wait)
		g.mu.Lock()
	}
}

// take reserves a run of 1 to want IDs within one millisecond and returns its timestamp,
// first sequence and length, or n = 0 and a.wait set when it must wait first. g.mu must
// be held.
func (g *Generator) take(want int, a *attempt) (ts, seq int64, n int, err error) {
	if s := g.suspended.Load(); s != nil {
		return 0, 0, 0, s.err
	}
	now, sub, err := g.read(a)
	if err != nil || a.wait > 0 {
		return 0, 0, 0, err
	}
	// The clock may be behind last only because last was borrowed ahead of it (a step back
	// from the highest reading was handled by read); issuing from last on is safe either way.
	ts = max(now, g.last)
	if ts <= g.lowest {
		return 0, 0, 0, g.floorError(now)
	}
	switch {
	case ts > g.last:
		seq = g.start()
	case g.seq < g.maxSeq:
		seq = g.seq + 1
	default:
		// This millisecond's sequence is spent: move on to the next one, now if it is within
		// BorrowMax of the clock, else once the clock has come that close.
		ts++
		if err = g.check(ts); err != nil {
			return 0, 0, 0, err
		}
		if target := ts - g.borrow; now < target {
			a.wait = time.Duration(target-now)*time.Millisecond - time.Duration(sub)
			return 0, 0, 0, nil
		}
		seq = g.start()
	}
	if err = g.check(ts); err != nil {
		return 0, 0, 0, err
	}
	n = int(min(int64(want), g.maxSeq-seq+1))
	g.last, g.seq = ts, seq+int64(n)-1
	return ts, seq, n, nil
}

// read returns the clock's Unix ms and the nanoseconds past it, after dealing with a
// backwards step from the highest reading seen: a small one is slept out (a.wait is set to
// twice its size, as Leaf does), a larger one, or one still there after the sleep, is
// refused. g.mu must be held.
func (g *Generator) read(a *attempt) (now, sub int64, err error) {
	now, sub = g.readClock()
	if now < g.seen {
		back := g.seen - now
		switch {
		case a.backWait > 0:
			return 0, 0, fmt.Errorf("%w by %dms, still %dms behind after waiting %v",
				ErrClockBackwards, a.back, back, a.backWait)
		case back > g.maxBack:
			return 0, 0, fmt.Errorf("%w by %dms, more than the %v it waits out", ErrClockBackwards, back, g.maxBackWait)
		}
		a.back, a.backWait = back, 2*time.Duration(back)*time.Millisecond
		a.wait = a.backWait
		return 0, 0, nil
	}
	a.back, a.backWait = 0, 0
	g.seen = now
	return now, sub, nil
}

func (g *Generator) readClock() (ms, sub int64) {
	t := g.clock.Now()
	// UnixMilli rounds towards minus infinity and Nanosecond is never negative, so sub is
	// the time past ms even before 1970.
	return t.UnixMilli(), int64(t.Nanosecond() % int(time.Millisecond))
}

// check reports whether ts may be issued now: not suspended, within the layout, not past
// the ceiling.
func (g *Generator) check(ts int64) error {
	if s := g.suspended.Load(); s != nil {
		return s.err
	}
	if ts > g.maxTS {
		return fmt.Errorf("%w: timestamp %d is past the layout's last, %d (%s)",
			ErrTimestampOverflow, ts, g.maxTS, time.UnixMilli(g.maxTS).UTC().Format(time.RFC3339Nano))
	}
	if c := g.ceiling.Load(); c > 0 && ts > c {
		return fmt.Errorf("%w: timestamp %d is %dms past the ceiling %d", ErrCeiling, ts, ts-c, c)
	}
	return nil
}

// start returns the sequence a new millisecond starts at.
func (g *Generator) start() int64 {
	if g.dense || g.startN <= 1 {
		return 0
	}
	r := g.rand(g.startN)
	if r < 0 || r >= g.startN {
		return 0
	}
	return int64(r)
}

func (g *Generator) floorError(now int64) error {
	if g.floor > g.layout.Epoch {
		return fmt.Errorf("%w: clock reads %d, %dms short of passing the floor %d (a timestamp this worker ID may already have used)",
			ErrClockBackwards, now, g.floor-now+1, g.floor)
	}
	return fmt.Errorf("%w: clock reads %d, %dms short of passing the layout's epoch %d",
		ErrClockBackwards, now, g.layout.Epoch-now+1, g.layout.Epoch)
}

// Issued returns the highest timestamp issued so far (Unix ms), Floor before the first ID.
// It may be ahead of the clock when borrowed, and it counts timestamps taken by a Fill that
// then failed. A heartbeat that records it lets a restart pass it as Floor.
func (g *Generator) Issued() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// SetCeiling makes the generator refuse, with ErrCeiling, any timestamp > ts (Unix ms);
// ts <= 0 removes the limit. It is safe to call concurrently with Next and takes effect
// for IDs not yet taken.
func (g *Generator) SetCeiling(ts int64) {
	g.ceiling.Store(max(ts, 0))
}

// Suspend makes Next and Fill fail with an error wrapping both ErrSuspended and err (nil
// means just ErrSuspended) until Resume, e.g. when the worker-ID lease is lost. It takes
// effect for IDs not yet taken; one being taken concurrently may still be returned, so
// suspend with a margin before the worker ID could pass to someone else.
func (g *Generator) Suspend(err error) {
	switch {
	case err == nil:
		err = ErrSuspended
	case !errors.Is(err, ErrSuspended):
		err = fmt.Errorf("%w: %w", ErrSuspended, err)
	}
	g.suspended.Store(&suspension{err: err})
}

// Resume undoes Suspend.
func (g *Generator) Resume() {
	g.suspended.Store(nil)
}

// Layout returns the generator's layout.
func (g *Generator) Layout() Layout { return g.layout }

// WorkerID returns the generator's worker ID.
func (g *Generator) WorkerID() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.worker
}

// Rebind moves a suspended generator to another worker ID, with floor as its new Floor
// (as in Config): for a dispenser whose worker ID was lost and that was given another
// one, so that everything holding the generator keeps it. It refuses (ErrInvalidConfig)
// a worker ID or floor out of range, and a generator that is not suspended, since an ID
// being taken concurrently could otherwise carry either worker ID. The generator stays
// suspended: its new heartbeat resumes it once the new ID's record is written.
//
// Timestamps stay above everything this generator issued with its earlier worker ID
// too (Issued never goes down), which costs nothing and keeps its IDs increasing.
func (g *Generator) Rebind(workerID, floor int64) error {
	if workerID < 0 || workerID > g.layout.MaxWorkerID() {
		return fmt.Errorf("%w: WorkerID is %d, must be 0 to %d with %d worker bits",
			ErrInvalidConfig, workerID, g.layout.MaxWorkerID(), g.layout.WorkerBits)
	}
	if floor < 0 || floor >= g.maxTS {
		return fmt.Errorf("%w: Floor is %d, must be 0 to %d", ErrInvalidConfig, floor, g.maxTS-1)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.suspended.Load() == nil {
		return fmt.Errorf("%w: Rebind of a generator that is issuing: suspend it first", ErrInvalidConfig)
	}
	g.worker, g.workerPart = workerID, workerID<<g.layout.SequenceBits
	g.floor, g.lowest = floor, max(floor, g.layout.Epoch)
	g.last = max(g.last, floor)
	return nil
}

// Stats returns a snapshot of the generator's state, reading the clock once.
func (g *Generator) Stats() Stats {
	g.mu.Lock()
	// Read under the lock so that no call slips in between with a newer reading, which
	// would show as a spurious offset.
	now, _ := g.readClock()
	last, seen := g.last, g.seen
	g.mu.Unlock()
	s := Stats{Issued: last, Refused: g.refused.Load()}
	if last > now {
		s.Borrowed = time.Duration(last-now) * time.Millisecond
	}
	if now < seen {
		s.Offset = time.Duration(seen-now) * time.Millisecond
	}
	return s
}
