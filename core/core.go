package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// SegmentSource hands out segment IDs (segment.Generator). TryFill never waits and does
// no I/O: ok=false means the IDs are not in memory yet and Fill, which may wait until
// ctx ends, must be called instead.
type SegmentSource interface {
	TryFill(tag string, dst []int64) (ok bool, err error)
	Fill(ctx context.Context, tag string, dst []int64) error
}

// SnowflakeSource hands out snowflake IDs (snowflake.Generator). Fill waits at most
// about a millisecond (a spent sequence) or twice a small clock step back; a refusal it
// may lift by itself soon (suspended, at its ceiling) is waited out by Wait.
type SnowflakeSource interface {
	Fill(dst []int64) error
}

// Batches hands out ready-made replies (package pools): ok=false when it has none of
// that shape, and the core fills the IDs itself.
type Batches interface {
	Take(kind wire.Kind, tag string, n int, enc wire.Encoding) (reply []byte, ok bool)
}

// Monotonic serves the segment tags marked monotonic and keeps their marks (package
// monotonic's Manager). IsMonotonic is asked for every segment request, so it must cost
// no more than a map lookup; TryFill and Fill are SegmentSource's for those tags. Ready
// is closed once the marks are loaded: until then no segment tag can be served, since it
// is not known which are monotonic.
type Monotonic interface {
	Ready() <-chan struct{}
	IsMonotonic(tag string) (bool, error)
	TryFill(tag string, dst []int64) (ok bool, err error)
	Fill(ctx context.Context, tag string, dst []int64) error

	// SetMonotonic writes a tag's mark; MonotonicTags reads every mark from where they
	// are kept (not a cached view), for the admin calls.
	SetMonotonic(ctx context.Context, tag string, on bool) error
	MonotonicTags(ctx context.Context) (map[string]bool, error)
}

// monotonicAsync is what a Monotonic may also offer (package monotonic's Manager does):
// FillAsyncWithin fills dst, which it owns until then, and calls done exactly once, at
// once or on another goroutine, within wait. A request forwarded to the leader, or
// waiting for one, then holds no goroutine of its own.
type monotonicAsync interface {
	FillAsyncWithin(tag string, dst []int64, wait time.Duration, done func(error))
}

// Config is what the core routes between, and its bounds. Sources left nil answer 503.
type Config struct {
	MaxBatch int              // largest count a request may ask for (--max-batch)
	Layout   snowflake.Layout // decodes snowflake IDs

	Segments   SegmentSource
	Snowflakes SnowflakeSource
	Batches    Batches   // ready-made replies of pools; nil: none
	Monotonic  Monotonic // nil: no tag is monotonic, and setting the mark is refused
	Tags       TagStore  // the admin calls' store; nil: they answer 503

	// Shaper gives every segment reply its tag's range (a pool's source gets the same
	// one, Shaper.Segments); nil: every tag has the default range. TagRanges is where
	// the admin calls set ranges; nil: they refuse to (and then Shaper may be nil).
	Shaper    *Shaper
	TagRanges TagRanges
	// Record is the deployment record, where the admin calls write a mark or a range
	// too (record.go says in which order); nil: none.
	Record Record

	// WaitMax bounds how long a request waits (for a segment being loaded, the marks,
	// a monotonic leader, a suspended snowflake generator); MaxWaiting bounds how many
	// requests and admin calls may wait at once: beyond it they are answered 503 at
	// once, so a stalled store cannot pile up goroutines.
	WaitMax    time.Duration
	MaxWaiting int
	// AdminTimeout bounds one admin call (a store round trip).
	AdminTimeout time.Duration

	Logger *slog.Logger
}

// DefaultWaitMax is how long a request may wait at most (Config.WaitMax): the one bound
// of a request's wait, which the core hands to every source it waits on (a monotonic
// tag's Fill and FillAsyncWithin take it as their deadline).
const DefaultWaitMax = 2 * time.Second

// DefaultConfig is the protocol's defaults.
func DefaultConfig() Config {
	return Config{
		MaxBatch:     wire.DefaultMaxBatch,
		Layout:       snowflake.DefaultLayout(),
		WaitMax:      DefaultWaitMax,
		MaxWaiting:   4096,
		AdminTimeout: 10 * time.Second,
	}
}

// Validate names the field, value and bound of the first bad setting.
func (c Config) Validate() error {
	if err := wire.CheckMaxBatch(c.MaxBatch); err != nil {
		return err
	}
	if err := c.Layout.Validate(); err != nil {
		return err
	}
	if c.WaitMax <= 0 {
		return fmt.Errorf("wait max %v: want > 0", c.WaitMax)
	}
	if c.MaxWaiting < 1 {
		return fmt.Errorf("max waiting %d: want >= 1", c.MaxWaiting)
	}
	if c.AdminTimeout <= 0 {
		return fmt.Errorf("admin timeout %v: want > 0", c.AdminTimeout)
	}
	if c.TagRanges != nil && c.Shaper == nil {
		return errors.New("core: tag ranges without a Shaper: their replies would not be shaped")
	}
	return nil
}

// Request is a request for IDs in the core's terms: what a face parsed. The face has
// checked the tag's name and the count (1 to MaxBatch).
type Request struct {
	Kind     wire.Kind
	Tag      string
	Count    int
	Encoding wire.Encoding // the reply's: a pool's ready-made reply must be in it
}

// Answer is the core's answer to a Request: Count IDs, strictly increasing, in IDs or
// as a ready-made reply body in the request's encoding (Reply), or an error (Err; CodeOf
// gives its wire code). Segment IDs have their tag's range (Config.Shaper): an opaque
// tag's are the images of its numbers, sorted. An answer Wait delivers holds a slice of the core's: the face
// calls Release once it no longer reads IDs.
type Answer struct {
	IDs   []int64
	Reply []byte
	Err   error

	buf  *[]int64 // the core's pooled slice behind IDs, for Release
	core *Core
}

// Release gives the IDs' memory back to the core. It is safe on any Answer, once.
func (a *Answer) Release() {
	if a.buf != nil {
		a.core.ids.Put(a.buf)
		a.buf, a.IDs = nil, nil
	}
}

// ErrOverloaded is the refusal (a 503) of a request that would wait while MaxWaiting
// requests already wait. Faces count it (metrics.Rejected).
var ErrOverloaded = fmt.Errorf("%w: too many requests are already waiting for segments or admin calls", wire.ErrUnavailable)

// errStopping refuses a wait once Stop began.
var errStopping = fmt.Errorf("%w: the dispenser is stopping", wire.ErrUnavailable)

// snowflakeRetry is how often a held snowflake request asks the generator again.
const snowflakeRetry = 5 * time.Millisecond

// Core routes requests between the sources. It is safe for concurrent use.
type Core struct {
	cfg    Config
	log    *slog.Logger
	stats  [2]kindCounters // by wire.Kind
	ids    sync.Pool       // *[]int64, for the answers of Wait
	async  monotonicAsync  // Monotonic's FillAsyncWithin, when it has one
	marked <-chan struct{} // Monotonic's Ready; nil without monotonic tags

	waiting  chan struct{} // a slot per request waiting, and per admin call
	mu       sync.Mutex    // orders a waiter's wg.Add before Stop's wg.Wait
	stopping bool
	stopped  chan struct{} // closed by Stop: held requests answer at once
	wg       sync.WaitGroup
}

// New checks cfg and returns the core.
func New(cfg Config) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Core{
		cfg:     cfg,
		log:     cfg.Logger,
		waiting: make(chan struct{}, cfg.MaxWaiting),
		stopped: make(chan struct{}),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Monotonic != nil {
		c.marked = cfg.Monotonic.Ready()
		c.async, _ = cfg.Monotonic.(monotonicAsync)
	}
	return c, nil
}

// MaxBatch is the largest count a request may ask for.
func (c *Core) MaxBatch() int { return c.cfg.MaxBatch }

// WaitMax is how long a request may wait at most.
func (c *Core) WaitMax() time.Duration { return c.cfg.WaitMax }

// Layout is the snowflake layout IDs are decoded with (Leaf's decodeSnowflakeId takes
// apart any long, which Decode refuses below 1).
func (c *Core) Layout() snowflake.Layout { return c.cfg.Layout }

// TagRow is a segment tag's row in its store (package segment's Tag), as the status
// page and Leaf's /db show it.
type TagRow = segment.Tag

// Layout is the snowflake bit layout (package snowflake's), which Leaf's decode page
// takes IDs apart with.
type Layout = snowflake.Layout

// Decoded is a snowflake ID taken apart (package snowflake's), as both faces answer it:
// the faces take it from the core, which decodes with the deployment's layout.
type Decoded = snowflake.Decoded

// Decode takes a snowflake ID apart with the configured layout.
func (c *Core) Decode(id int64) (Decoded, error) {
	return c.cfg.Layout.Decode(id)
}

// Take answers r from memory, without waiting and without I/O: with dst filled (dst
// has r.Count elements), a ready-made reply, or an error; ok=false when the answer needs
// a wait, for which the face calls Wait. A request answered here allocates nothing.
func (c *Core) Take(r Request, dst []int64) (a Answer, ok bool) {
	if r.Kind == wire.Segment {
		return c.takeSegment(r, dst)
	}
	if c.cfg.Batches != nil {
		if reply, ok := c.cfg.Batches.Take(r.Kind, r.Tag, r.Count, r.Encoding); ok {
			return c.pooled(r, reply), true
		}
	}
	if c.cfg.Snowflakes == nil {
		return c.answer(r, nil, errNoSnowflakes), true
	}
	err := c.cfg.Snowflakes.Fill(dst)
	if mayResume(err) {
		return Answer{}, false
	}
	return c.answer(r, dst, err), true
}

// takeSegment is Take for a segment tag: a monotonic tag from its leader's one
// sequence (never a pool or the buffers, whose segments are cut ahead of time), any
// other from a pool or the tag's buffers. Until the marks are loaded, every segment
// request waits for them.
func (c *Core) takeSegment(r Request, dst []int64) (Answer, bool) {
	if c.cfg.Monotonic != nil {
		if !isClosed(c.marked) {
			return Answer{}, false
		}
		mono, err := c.cfg.Monotonic.IsMonotonic(r.Tag)
		if err != nil {
			return c.answer(r, nil, err), true
		}
		if mono {
			ok, err := c.cfg.Monotonic.TryFill(r.Tag, dst)
			if err == nil && !ok {
				return Answer{}, false
			}
			return c.answer(r, dst, c.shaped(r, dst, err)), true
		}
	}
	if c.cfg.Batches != nil {
		if reply, ok := c.cfg.Batches.Take(r.Kind, r.Tag, r.Count, r.Encoding); ok {
			return c.pooled(r, reply), true
		}
	}
	if c.cfg.Segments == nil {
		return c.answer(r, nil, errNoSegments), true
	}
	ok, err := c.cfg.Segments.TryFill(r.Tag, dst)
	if err == nil && !ok {
		return Answer{}, false
	}
	return c.answer(r, dst, c.shaped(r, dst, err)), true
}

// shaped gives the segment IDs a fill put in ids their tag's range (Shaper.Shape) when
// the fill, which returned err, succeeded. The range is asked for after the fill: a
// range written before the tag's first segment was taken (as an opaque tag's add does)
// is the one its IDs get.
func (c *Core) shaped(r Request, ids []int64, err error) error {
	if err != nil || c.cfg.Shaper == nil || r.Kind != wire.Segment {
		return err
	}
	return c.cfg.Shaper.Shape(r.Tag, ids)
}

var (
	errNoSegments   = fmt.Errorf("%w: segment IDs are not configured on this dispenser", wire.ErrUnavailable)
	errNoSnowflakes = fmt.Errorf("%w: snowflake IDs are not configured on this dispenser", wire.ErrUnavailable)
)

// Wait answers r, which Take could not answer at once, off the caller's goroutine and
// within WaitMax: it calls done exactly once with the answer, whose IDs are the core's
// (done calls Answer.Release when it is through with them). It returns an error instead,
// and never calls done, when r may not wait: MaxWaiting requests already wait
// (ErrOverloaded) or the core is stopping; that error is the answer to send.
func (c *Core) Wait(r Request, done func(Answer)) error {
	if err := c.startWaiter(); err != nil {
		st := c.kind(r.Kind)
		if errors.Is(err, ErrOverloaded) {
			st.overloaded.Add(1)
		}
		st.unavailable(err)
		return err
	}
	st := c.kind(r.Kind)
	st.waited.Add(1)
	buf := c.getIDs(r.Count)
	finish := func(err error) {
		a := c.answer(r, *buf, c.shaped(r, *buf, err))
		if a.Err != nil {
			st.waitErrors.Add(1)
			c.ids.Put(buf)
		} else {
			a.buf, a.core = buf, c
		}
		c.endWaiter()
		done(a)
	}
	// A monotonic tag whose marks are in and whose Manager answers asynchronously (a
	// forward to the leader) holds no goroutine.
	if r.Kind == wire.Segment && c.async != nil && isClosed(c.marked) {
		if mono, err := c.cfg.Monotonic.IsMonotonic(r.Tag); err == nil && mono {
			c.async.FillAsyncWithin(r.Tag, *buf, c.cfg.WaitMax, finish)
			return nil
		}
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.WaitMax)
		defer cancel()
		finish(c.fill(ctx, r, *buf))
	}()
	return nil
}

// fill fills ids for a request that waits, within ctx (WaitMax).
func (c *Core) fill(ctx context.Context, r Request, ids []int64) error {
	if r.Kind == wire.Snowflake {
		return c.fillSnowflake(ctx, ids)
	}
	if c.cfg.Monotonic != nil {
		select {
		case <-c.marked:
		case <-ctx.Done():
			return fmt.Errorf("%w: the monotonic tag marks did not load within %v", wire.ErrUnavailable, c.cfg.WaitMax)
		}
		mono, err := c.cfg.Monotonic.IsMonotonic(r.Tag)
		if err != nil {
			return err
		}
		if mono {
			return c.waited(ctx, r.Tag, c.cfg.Monotonic.Fill(ctx, r.Tag, ids))
		}
	}
	if c.cfg.Segments == nil {
		return errNoSegments
	}
	return c.waited(ctx, r.Tag, c.cfg.Segments.Fill(ctx, r.Tag, ids))
}

// waited turns a fill that failed because the wait ran out into a 503 that says so;
// an error that already has a class keeps it.
func (c *Core) waited(ctx context.Context, tag string, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if code, _ := CodeOf(err); code != 500 {
		return err
	}
	return fmt.Errorf("%w: no IDs of %q within %v: %w", wire.ErrUnavailable, tag, c.cfg.WaitMax, err)
}

// fillSnowflake asks the generator until it issues, refuses for a reason that does not
// lift by itself, ctx ends, or Stop begins. A generator that refuses for a while
// (suspended while its lease is renewed or its worker ID replaced, at its ceiling until
// the next heartbeat record) usually issues again within a second; a client that hedges
// has meanwhile sent its copy to another dispenser. A clock stepped back is answered at
// once: it lasts as long as the step.
func (c *Core) fillSnowflake(ctx context.Context, ids []int64) error {
	if c.cfg.Snowflakes == nil {
		return errNoSnowflakes
	}
	tick := time.NewTicker(snowflakeRetry)
	defer tick.Stop()
	for {
		err := c.cfg.Snowflakes.Fill(ids)
		if !mayResume(err) {
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return err
		case <-c.stopped:
			return err
		}
	}
}

// mayResume reports whether the snowflake generator's refusal lifts by itself soon.
func mayResume(err error) bool {
	return errors.Is(err, snowflake.ErrSuspended) || errors.Is(err, snowflake.ErrCeiling)
}

// Get answers r, waiting when it must (within WaitMax, and until ctx ends): Take, then
// Wait. It is for a face that serves each request on a goroutine of its own (HTTP).
// The answer's IDs are dst's, or the core's (Release them).
func (c *Core) Get(ctx context.Context, r Request, dst []int64) Answer {
	if a, ok := c.Take(r, dst); ok {
		return a
	}
	ch := make(chan Answer, 1)
	if err := c.Wait(r, func(a Answer) { ch <- a }); err != nil {
		return Answer{Err: err}
	}
	select {
	case a := <-ch:
		return a
	case <-ctx.Done():
		// The caller is gone; the answer, when it comes, is dropped (its IDs a gap).
		return Answer{Err: fmt.Errorf("%w: the request was abandoned: %w", wire.ErrUnavailable, ctx.Err())}
	}
}

// pooled is the answer of a ready-made reply.
func (c *Core) pooled(r Request, reply []byte) Answer {
	st := c.kind(r.Kind)
	st.pooled.Add(1)
	st.idsIssued.Add(uint64(r.Count))
	return Answer{Reply: reply}
}

// answer is the answer of a fill into ids that returned err, counted.
func (c *Core) answer(r Request, ids []int64, err error) Answer {
	st := c.kind(r.Kind)
	if err != nil {
		st.unavailable(err)
		return Answer{Err: err}
	}
	st.idsIssued.Add(uint64(len(ids)))
	return Answer{IDs: ids}
}

// startWaiter reserves a slot for a request answered off the caller's goroutine (a
// wait, an admin call) and registers it with Stop. Every successful call is paired with
// one endWaiter.
func (c *Core) startWaiter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return errStopping
	}
	select {
	case c.waiting <- struct{}{}:
	default:
		return ErrOverloaded
	}
	c.wg.Add(1)
	return nil
}

func (c *Core) endWaiter() {
	<-c.waiting
	c.wg.Done()
}

// Stop refuses new waits and admin calls (503), answers held snowflake requests at
// once, and returns when every request and admin call already waiting was answered
// (within WaitMax and AdminTimeout). The faces stop taking requests first.
func (c *Core) Stop() {
	c.mu.Lock()
	if !c.stopping {
		c.stopping = true
		close(c.stopped)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// getIDs returns a slice of n IDs from the pool. The same pointer goes back to the
// pool: a new pointer to the slice would be an allocation per request.
func (c *Core) getIDs(n int) *[]int64 {
	if p, ok := c.ids.Get().(*[]int64); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	ids := make([]int64, n, max(n, 16))
	return &ids
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

var _ SegmentSource = (*segment.Generator)(nil)
