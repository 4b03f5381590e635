package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/wire"
)

// ErrBufferClosed is returned by Buffer.Next and Cursor.Next once the buffer is closed.
var ErrBufferClosed = errors.New("leafbus: buffer closed")

// BufferOptions shape a Buffer. Start from DefaultBufferOptions and change what you
// need; Client.Buffer validates them.
type BufferOptions struct {
	// Batch is how many IDs one background request asks for, 1 to wire.MaxBatchLimit
	// (default 1000). Matching a dispenser's pool size (--pool kind:tag:<size>:depth)
	// gets pre-filled replies.
	Batch int
	// Batches bounds the buffer: it never holds more than Batches*Batch IDs, which may
	// be at most wire.MaxBatchLimit (default 2).
	Batches int
	// LowWater is the level under which the buffer fetches another batch: 1 to
	// (Batches-1)*Batch+1, so that a fetch always fits under the bound. 0 (the default)
	// means Batch, fetching when less than one batch is left, and follows Batch when
	// you change it.
	LowWater int
	// RetryMax caps the back-off between failed fetches; > 0 (default 2s). The first
	// retry waits 25 to 50ms, doubling.
	RetryMax time.Duration
}

// DefaultBufferOptions returns a buffer of two batches of 1000 IDs that fetches when
// less than one batch is left.
func DefaultBufferOptions() BufferOptions {
	return BufferOptions{Batch: 1000, Batches: 2, RetryMax: 2 * time.Second}
}

// Validate reports the first option out of range, naming the field, its value and the
// bound (and the options the bound depends on).
func (o BufferOptions) Validate() error {
	switch {
	case o.Batch < 1 || o.Batch > wire.MaxBatchLimit:
		return fmt.Errorf("leafbus: buffer: Batch %d must be between 1 and %d", o.Batch, wire.MaxBatchLimit)
	case o.Batches < 1 || o.Batches > wire.MaxBatchLimit/o.Batch:
		return fmt.Errorf("leafbus: buffer: Batches %d must be between 1 and %d with Batch %d (at most %d IDs held)",
			o.Batches, wire.MaxBatchLimit/o.Batch, o.Batch, wire.MaxBatchLimit)
	case o.LowWater < 0 || o.LowWater > (o.Batches-1)*o.Batch+1:
		return fmt.Errorf("leafbus: buffer: LowWater %d must be 0 (one batch) or between 1 and %d with Batch %d and Batches %d",
			o.LowWater, (o.Batches-1)*o.Batch+1, o.Batch, o.Batches)
	case o.RetryMax <= 0:
		return fmt.Errorf("leafbus: buffer: RetryMax %v must be > 0", o.RetryMax)
	}
	return nil
}

// fetchRetryMin is the floor of a buffer's back-off between failed fetches; its cap is
// BufferOptions.RetryMax (a RetryMax below it makes every wait RetryMax).
const fetchRetryMin = 50 * time.Millisecond

// Buffer keeps IDs of one kind and tag in the client's memory, as Didi's Tinyid client
// does, so that Next is an in-memory operation: one goroutine, owned by the Buffer and
// stopped by Close, asks a dispenser for a batch whenever fewer than LowWater IDs are
// left, and the buffer never holds more than Batches*Batch IDs. Next is safe for
// concurrent use and never returns an ID twice. From a batch already fetched it takes
// one atomic add and no lock, so it costs a few nanoseconds and goroutines calling it
// together never wait for each other (they do share the add's cache line: two of them
// on two cores take about half what one takes alone; a Cursor per goroutine scales,
// see Buffer.Cursor).
//
// The trade-off, to weigh before using it:
//   - IDs held by a buffer are lost when the process exits or Close is called: a gap
//     of up to Batches*Batch IDs in the tag's sequence, never a repeat.
//   - Ordering is per buffer: IDs come in the order they were fetched, increasing within
//     a batch and across batches from one dispenser, but only trend-increasing across
//     dispensers, and unrelated to the order other clients see.
//   - A snowflake ID's timestamp is when it was fetched, not when Next returned it.
//   - Errors show late: Next returns the last fetch's error only once the buffer is
//     empty; until then it serves what it holds.
type Buffer struct {
	kind  wire.Kind
	tag   string
	opts  BufferOptions                                // valid, LowWater set
	fetch func(ctx context.Context, dst []int64) error // fills one batch: the client's Fill

	// cur is the batch Next takes from without a lock. Only holders of mu replace it.
	cur atomic.Pointer[batch]

	mu      sync.Mutex
	queue   []*batch      // fetched after cur, in fetch order
	queued  int           // IDs in queue
	err     error         // the last fetch's error; nil after a fetch succeeds
	changed chan struct{} // closed (and replaced) when IDs arrive, a fetch fails or Close
	// closed is set by Close under mu. It is atomic so that a Cursor can check it for
	// every ID without the lock: IDs a cursor still holds are not handed out after Close.
	closed atomic.Bool

	want      chan struct{} // a Next took the buffer under LowWater
	stop      context.CancelFunc
	done      chan struct{} // closed when the fetcher returned
	closeOnce sync.Once
}

// batch is one fetched batch, kept as runs of consecutive IDs rather than one int64 per
// ID: a segment reply is a few consecutive ranges, and snowflake IDs of one millisecond
// have consecutive sequence numbers, so a batch of 1000 is one run, or a handful, of
// 16 bytes each instead of 8 KB written by the fetcher's core and read by every other
// (and allocated and collected once per batch). Next takes index next.Add(1)-1, so
// every index is taken by exactly one Next; next runs past size once the batch is
// spent, and a Next that gets such an index moves on under the lock. A batch is never
// written after it is published, so readers need no lock to map an index to its ID.
type batch struct {
	first int64 // the ID at index 0: with runs nil, index i holds first+i
	size  int64 // IDs in the batch (the stock bound counts IDs, not runs)
	// runs is nil when the batch is one run; else its runs in fetch order, runs[0]
	// starting at index 0, each up to the next one's start (the last up to size).
	runs []run
	next atomic.Int64
	// low is the index whose taking leaves the buffer under its low-water mark: the Next
	// that takes it wakes the fetcher. It is set under Buffer.mu when the batch becomes
	// current and whenever a fetch adds to the queue behind it (see setLow).
	low atomic.Int64
}

// run is IDs first, first+1, ... at a batch's indexes off, off+1, ... up to the next
// run's off (or the batch's size).
type run struct {
	first int64
	off   int64
}

// newBatch compresses ids, in fetch order, into runs. ids is the fetcher's scratch,
// reused for the next fetch: the batch keeps no reference to it. IDs that are not
// consecutive at all still work, as runs of one, at 16 bytes an ID and a binary search
// per take.
func newBatch(ids []int64) *batch {
	c := &batch{first: ids[0], size: int64(len(ids))}
	breaks := 0
	for k := 1; k < len(ids); k++ {
		if ids[k] != ids[k-1]+1 {
			breaks++
		}
	}
	if breaks == 0 {
		return c // the common case: no slice, and at() is one add
	}
	c.runs = make([]run, 0, breaks+1)
	c.runs = append(c.runs, run{first: ids[0]})
	for k := 1; k < len(ids); k++ {
		if ids[k] != ids[k-1]+1 {
			c.runs = append(c.runs, run{first: ids[k], off: int64(k)})
		}
	}
	return c
}

// at is the ID at index i, 0 <= i < size.
func (c *batch) at(i int64) int64 {
	if c.runs == nil {
		return c.first + i
	}
	k := c.runAt(i)
	return c.runs[k].first + i - c.runs[k].off
}

// runAt is the index in runs of the run holding batch index i (runs not nil): the last
// run starting at or before i, by binary search.
func (c *batch) runAt(i int64) int {
	lo, hi := 0, len(c.runs) // runs[lo].off <= i < runs[hi].off, hi = len meaning size
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if c.runs[mid].off <= i {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// stretch is the consecutive IDs at indexes i..end-1 (end <= size) that start at i: the
// first ID and how many follow it before a run ends or end is reached.
func (c *batch) stretch(i, end int64) (first, n int64) {
	if c.runs == nil {
		return c.first + i, end - i
	}
	k := c.runAt(i)
	if k+1 < len(c.runs) {
		end = min(end, c.runs[k+1].off)
	}
	return c.runs[k].first + i - c.runs[k].off, end - i
}

// left is how many IDs the batch still holds.
func (c *batch) left() int {
	if n := c.size - c.next.Load(); n > 0 {
		return int(n)
	}
	return 0
}

// spentBatch stands for no batch: every take from it fails. Its counter starts far from
// both ends, so that no number of Next calls can wrap it.
func spentBatch() *batch {
	c := &batch{}
	c.next.Store(math.MaxInt64 / 2)
	return c
}

// Buffer starts a buffer of kind and tag IDs; the first batch is asked for at once.
// Close it to stop its goroutine.
func (c *Client) Buffer(kind wire.Kind, tag string, opts BufferOptions) (*Buffer, error) {
	return newBuffer(kind, tag, opts, func(ctx context.Context, dst []int64) error {
		return c.Fill(ctx, kind, tag, dst)
	})
}

// newBuffer starts a buffer whose batches come from fetch (tests give an instant one,
// to measure Next rather than the dispenser).
func newBuffer(kind wire.Kind, tag string, opts BufferOptions, fetch func(context.Context, []int64) error) (*Buffer, error) {
	if kind != wire.Segment && kind != wire.Snowflake {
		return nil, fmt.Errorf("buffer kind %d: want wire.Segment or wire.Snowflake", kind)
	}
	if err := wire.CheckTag(tag); err != nil {
		return nil, fmt.Errorf("buffer of %s IDs for %s: %w", kind, wire.Quote(tag), err)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.LowWater == 0 {
		opts.LowWater = opts.Batch
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Buffer{
		kind: kind, tag: tag, opts: opts, fetch: fetch,
		changed: make(chan struct{}),
		want:    make(chan struct{}, 1),
		stop:    cancel,
		done:    make(chan struct{}),
	}
	b.cur.Store(spentBatch())
	go b.run(ctx)
	return b, nil
}

// Next returns the next ID from memory. When the buffer is empty it waits for the
// batch being fetched, until ctx ends; if the last fetch failed it returns that error
// (a *Error for a dispenser's error reply) at once.
func (b *Buffer) Next(ctx context.Context) (int64, error) {
	c := b.cur.Load()
	if i := c.next.Add(1) - 1; i < c.size {
		if i == c.low.Load() {
			b.wake()
		}
		return c.at(i), nil
	}
	return b.nextSlow(ctx)
}

// nextSlow is Next once the current batch is spent: it claims one index.
func (b *Buffer) nextSlow(ctx context.Context) (int64, error) {
	c, start, _, err := b.takeSlow(ctx, 1)
	if err != nil {
		return 0, err
	}
	return c.at(start), nil
}

// claim takes up to n indexes of batch c with one add: next..next+n-1, cut at the
// batch's end (so a claim never spans batches, and the indexes past the end are spent
// like those a Next gets there). Every index goes to exactly one claim or Next. The
// claim holding c's low-water index wakes the fetcher, as the Next that takes it would
// (see setLow: low is read after the add). It returns the indexes start..end-1, and
// ok false when c is spent.
func (b *Buffer) claim(c *batch, n int64) (start, end int64, ok bool) {
	end = c.next.Add(n)
	start = end - n
	if start >= c.size {
		return 0, 0, false
	}
	end = min(end, c.size)
	if low := c.low.Load(); start <= low && low < end {
		b.wake()
	}
	return start, end, true
}

// take claims indexes start..end-1 (1 to n of them) of batch c for a Cursor: from the
// current batch without a lock, else as takeSlow does.
func (b *Buffer) take(ctx context.Context, n int64) (c *batch, start, end int64, err error) {
	c = b.cur.Load()
	if start, end, ok := b.claim(c, n); ok {
		return c, start, end, nil
	}
	return b.takeSlow(ctx, n)
}

// takeSlow claims 1 to n indexes of a batch once the current batch is spent: it moves
// on to the next batch fetched, or waits for one, with Next's errors (ErrBufferClosed,
// the last fetch's error, ctx's).
func (b *Buffer) takeSlow(ctx context.Context, n int64) (*batch, int64, int64, error) {
	for {
		b.mu.Lock()
		if b.closed.Load() {
			b.mu.Unlock()
			return nil, 0, 0, ErrBufferClosed
		}
		c := b.cur.Load()
		if c.left() == 0 && len(b.queue) > 0 {
			c = b.queue[0]
			b.queue[0] = nil
			b.queue = b.queue[1:]
			b.queued -= int(c.size)
			b.install(c)
		}
		if c.left() > 0 {
			b.mu.Unlock()
			if start, end, ok := b.claim(c, n); ok {
				return c, start, end, nil
			}
			continue // others took the rest meanwhile
		}
		err, changed := b.err, b.changed
		b.mu.Unlock()
		b.poke()
		if err != nil {
			return nil, 0, 0, err
		}
		select {
		case <-ctx.Done():
			return nil, 0, 0, fmt.Errorf("%s ID of %q from the buffer: %w", b.kind, b.tag, ctx.Err())
		case <-changed:
		}
	}
}

// install makes c, fresh from a fetch, the batch Next takes from; b.mu is held. It
// moves IDs from the queue to the current batch, so the count stays: a batch installed
// under the mark (low < 0, no index of it wakes the fetcher) finds the fetcher already
// woken by the take that went under, or still fetching.
func (b *Buffer) install(c *batch) {
	b.setLow(c)
	b.cur.Store(c)
}

// setLow sets c's low-water index and returns it. Taking index i leaves len-1-i IDs in
// c and b.queued behind it: under LowWater from i = len - (LowWater - queued) on. Only
// the Next that takes exactly that index wakes the fetcher, and that is enough: the
// fetcher goes idle only when the buffer holds at least LowWater IDs (next <= low), with
// b.mu held; low changes only under b.mu (a fetch added, or a batch installed, which
// leaves the count as it was); and a Next reads low after its add, so it sees any change
// made before the fetcher last looked. b.mu is held.
func (b *Buffer) setLow(c *batch) {
	c.low.Store(c.size - int64(b.opts.LowWater-b.queued))
}

// count is how many IDs the buffer holds; b.mu is held.
func (b *Buffer) count() int { return b.cur.Load().left() + b.queued }

// Len is how many IDs the buffer holds now.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count()
}

// Close stops the background fetch, waits for its goroutine to return and drops the IDs
// held (they are never handed out). Next then returns ErrBufferClosed. Close may be
// called more than once.
func (b *Buffer) Close() {
	b.closeOnce.Do(func() {
		b.stop()
		<-b.done
		b.mu.Lock()
		b.closed.Store(true)
		b.cur.Store(spentBatch())
		b.queue, b.queued = nil, 0
		b.broadcast()
		b.mu.Unlock()
	})
}

// wake is poke for a taker that has just taken the buffer under its low-water mark, and
// may go on taking without ever blocking: it also gives up its processor for a moment.
// The fetcher a poke readies is queued to run next on the poking goroutine's P, and
// when every P is busy with takers nothing else runs it until that taker blocks or is
// preempted (about 10ms on), by which time the stock is long gone and every taker
// waits for the fetch. Yielding runs the fetcher while the stock still lasts. It costs
// the taker about 100-200 ns once per low-water crossing, a fraction of a nanosecond
// per ID in batches of hundreds or more.
func (b *Buffer) wake() {
	b.poke()
	runtime.Gosched()
}

// poke wakes the fetcher; a wake-up already pending is enough.
func (b *Buffer) poke() {
	select {
	case b.want <- struct{}{}:
	default:
	}
}

// broadcast wakes every Next waiting for a change; b.mu is held.
func (b *Buffer) broadcast() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// run is the buffer's goroutine: it asks for a batch while the buffer is under its
// low-water mark, backing off after failures, until ctx ends.
func (b *Buffer) run(ctx context.Context) {
	defer close(b.done)
	bo := backoff.New(backoff.Policy{Min: fetchRetryMin, Max: b.opts.RetryMax, Jitter: 0.5})
	// scratch is decoded into and compressed into runs by newBatch, which keeps no
	// reference to it, so one is enough for every fetch: Fill writes it only before it
	// returns.
	scratch := make([]int64, b.opts.Batch)
	for {
		b.mu.Lock()
		need := b.count() < b.opts.LowWater
		b.mu.Unlock()
		if !need {
			select {
			case <-ctx.Done():
				return
			case <-b.want:
			}
			continue
		}
		err := b.fetch(ctx, scratch)
		if ctx.Err() != nil {
			return // closing: what was fetched is dropped with the rest
		}
		var fetched *batch
		if err == nil {
			fetched = newBatch(scratch) // before the lock: takers that wait on it go on meanwhile
		}
		b.mu.Lock()
		if err != nil {
			b.err = err
		} else {
			b.add(fetched)
			b.err = nil
		}
		b.broadcast()
		b.mu.Unlock()
		if err == nil {
			bo.Reset()
			continue
		}
		if !bo.Wait(ctx) {
			return
		}
	}
}

// add puts a fetched batch behind the others, or makes it current when the current one
// is spent and none waits; b.mu is held.
func (b *Buffer) add(c *batch) {
	if b.cur.Load().left() == 0 && len(b.queue) == 0 {
		b.install(c)
		return
	}
	b.queue = append(b.queue, c)
	b.queued += int(c.size)
	b.setLow(b.cur.Load())
}
