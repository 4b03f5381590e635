package pools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// SegmentSource hands out segment IDs (segment.Generator). Fill may wait for the store;
// the IDs it puts in dst are strictly increasing and may span two segments.
type SegmentSource interface {
	Fill(ctx context.Context, tag string, dst []int64) error
}

// SnowflakeSource hands out snowflake IDs (snowflake.Generator): strictly increasing,
// spanning milliseconds when dst holds more than one millisecond's sequence.
type SnowflakeSource interface {
	Fill(dst []int64) error
}

// borrowReporter is what a SnowflakeSource may also offer (snowflake.Generator does) so
// that the pools' stats show how far ahead of the clock the generator has moved.
type borrowReporter interface {
	Stats() snowflake.Stats
}

// borrowed is how far sf has borrowed ahead of the clock, or 0 when it cannot tell.
func borrowed(sf SnowflakeSource) time.Duration {
	if r, ok := sf.(borrowReporter); ok {
		return r.Stats().Borrowed
	}
	return 0
}

// ErrInvalidPool is returned by New when a pool's spec is out of range, a kind and tag
// is configured twice, or a pool's kind has no source.
var ErrInvalidPool = errors.New("invalid pool configuration")

// Config configures Batches. Start from DefaultConfig and set Specs and the sources.
type Config struct {
	// Specs lists the pools: each keeps up to Depth ready replies of exactly Size IDs.
	Specs []Spec
	// Segments fills segment pools; required when a segment pool is configured.
	Segments SegmentSource
	// Snowflakes fills snowflake pools; required when a snowflake pool is configured.
	Snowflakes SnowflakeSource
	// IdleAfter is how long a pool may go without a Take before it halves its target
	// (dropping the ready batches above it), down to one batch. Default 30s; > 0.
	IdleAfter time.Duration
	// FillPause is the pause between two batches while a pool holds at least half its
	// target, so that a comfortable pool leaves its source (the snowflake lock, the
	// segment buffer) to the requests served directly. Below half there is no pause.
	// Default 1ms; >= 0.
	FillPause time.Duration
	// Logger receives fill failures and target changes; nil discards.
	Logger *slog.Logger
}

// Batches keeps pre-filled replies per (kind, tag) and hands each one out once: it is
// core.Batches of package core. A request is answered from a pool only when it asks
// for exactly the pool's Size IDs; any other count (and any kind and tag without a
// pool) gets ok=false and goes the service's normal path.
//
// Each ready batch holds its IDs encoded twice, binary then text, in one allocation:
// 8 bytes plus at most 20 (a 19-digit ID and its separator) per ID. Encoding once at
// fill time keeps Take free of per-ID work and of synchronisation, which a lazy
// encode-on-first-use would need; the price is at most 8 bytes per ID beside the text.
// Only one of the two is handed out and then the whole batch is forgotten, so a batch
// is never served twice, in either encoding. A pool's memory is therefore bounded by
// (Depth+2) * Size * 28 bytes: the ready batches, the one being prepared, and the
// filler's scratch.
//
// Text costs about fifty times binary to encode, and the Go client asks for binary,
// so a pool that was asked for no text during IdleAfter prepares binary only (8 bytes
// per ID). A text Take that then meets a binary-only batch drops it (a gap) and answers
// ok=false, and the filler goes back to preparing both.
//
// Adaptive depth: a pool starts aiming at Depth ready batches. A Take that finds it
// empty doubles the target (up to Depth); a pool that sees no Take for IdleAfter halves
// it and drops the batches above it. Dropped IDs are a gap, never a repeat. While a pool
// holds less than half its target the filler prepares batches back to back; above
// half it pauses FillPause between batches.
//
// Snowflake batches larger than one millisecond's sequence span milliseconds. When the
// generator is allowed to borrow (snowflake.Config.BorrowMax) it cuts them ahead of the
// clock instead of waiting; the generator bounds that window and reports it in Issued
// (which the heartbeat records), so the pools hold no borrowing logic of their own and
// only show the window in Stats. IDs in a ready batch were issued when it was cut: a
// batch handed out later (even after the worker ID was lost) repeats nothing, because
// nobody else can be given those timestamps with that worker ID.
type Batches struct {
	pools  map[poolKey]*pool
	order  []*pool // Specs order, for Stats
	sf     SnowflakeSource
	cfg    Config
	logger *slog.Logger

	mu      sync.Mutex
	running bool
}

type poolKey struct {
	kind wire.Kind
	tag  string
}

// pool is one (kind, tag): a channel of ready replies fed by one filler goroutine.
type pool struct {
	spec   Spec
	binLen int // a ready batch is binLen bytes of binary, then the text (if any)
	// ready holds encoded batches. The channel hands each element to exactly one
	// receiver, which is what "never the same batch twice" needs, and a non-blocking
	// receive of a slice header neither waits nor allocates.
	ready chan []byte
	wake  chan struct{} // a Take happened: the filler may have work

	target                      atomic.Int64
	taken, misses               atomic.Uint64
	textAsks                    atomic.Uint64 // Takes of the pool's size asking for text
	withText                    atomic.Bool   // the filler prepares text too (for Stats)
	filled, dropped, fillErrors atomic.Uint64
	lastError                   atomic.Pointer[string]
}

// DefaultConfig returns the tuning New was built for; Specs and the sources are left
// for the caller.
func DefaultConfig() Config {
	return Config{IdleAfter: 30 * time.Second, FillPause: time.Millisecond}
}

// Validate reports the first setting out of range, naming the field, its value and the
// bound; the error wraps ErrInvalidPool.
func (c Config) Validate() error {
	switch {
	case c.IdleAfter <= 0:
		return fmt.Errorf("%w: IdleAfter %v must be > 0", ErrInvalidPool, c.IdleAfter)
	case c.FillPause < 0:
		return fmt.Errorf("%w: FillPause %v must be >= 0", ErrInvalidPool, c.FillPause)
	}
	return checkSpecs(c.Specs, c.Segments != nil, c.Snowflakes != nil)
}

// orDefaults gives zero tuning fields their DefaultConfig value. It keeps callers
// written before DefaultConfig (cmd/dispenser's serve.go) working; delete it once every
// caller starts from DefaultConfig, and FillPause 0 then means no pause.
func (c Config) orDefaults() Config {
	d := DefaultConfig()
	if c.IdleAfter == 0 {
		c.IdleAfter = d.IdleAfter
	}
	if c.FillPause == 0 {
		c.FillPause = d.FillPause
	}
	return c
}

// New checks cfg and returns Batches whose pools are empty until Run fills them.
func New(cfg Config) (*Batches, error) {
	cfg = cfg.orDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	b := &Batches{pools: make(map[poolKey]*pool, len(cfg.Specs)), sf: cfg.Snowflakes, cfg: cfg, logger: logger}
	for _, sp := range cfg.Specs {
		k := poolKey{sp.Kind, sp.Tag}
		p := &pool{
			spec:   sp,
			binLen: 8 * sp.Size,
			ready:  make(chan []byte, sp.Depth),
			wake:   make(chan struct{}, 1),
		}
		p.target.Store(int64(sp.Depth))
		b.pools[k] = p
		b.order = append(b.order, p)
	}
	return b, nil
}

// checkSpecs checks each spec's ranges, that no kind and tag comes twice, and that each
// spec's kind has a source.
func checkSpecs(specs []Spec, haveSegments, haveSnowflakes bool) error {
	seen := make(map[poolKey]Spec, len(specs))
	for _, sp := range specs {
		if err := checkSpec(sp); err != nil {
			return err
		}
		switch {
		case sp.Kind == wire.Segment && !haveSegments:
			return fmt.Errorf("%w: pool %s: no segment source (Segments is nil)", ErrInvalidPool, sp)
		case sp.Kind == wire.Snowflake && !haveSnowflakes:
			return fmt.Errorf("%w: pool %s: no snowflake source (Snowflakes is nil)", ErrInvalidPool, sp)
		}
		k := poolKey{sp.Kind, sp.Tag}
		if have, dup := seen[k]; dup {
			return fmt.Errorf("%w: pool %s: %s:%s is already configured as %s", ErrInvalidPool, sp, sp.Kind, sp.Tag, have)
		}
		seen[k] = sp
	}
	return nil
}

// checkSpec repeats ParseSpec's range checks for specs built in code.
func checkSpec(sp Spec) error {
	if sp.Kind != wire.Segment && sp.Kind != wire.Snowflake {
		return fmt.Errorf("%w: pool %s: unknown kind %d", ErrInvalidPool, sp, sp.Kind)
	}
	if _, err := ParseSpec(sp.String()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPool, err)
	}
	return nil
}

// Take hands over a ready reply of n IDs of kind and tag in enc, or ok=false when the
// pool is empty, n is not its Size, or there is no such pool. It never waits and does
// not allocate; the reply is the caller's from then on and the pool forgets it.
func (b *Batches) Take(kind wire.Kind, tag string, n int, enc wire.Encoding) (reply []byte, ok bool) {
	p := b.pools[poolKey{kind, tag}]
	if p == nil || n != p.spec.Size {
		return nil, false
	}
	if enc == wire.Text {
		p.textAsks.Add(1)
	}
	var batch []byte
	select {
	case batch = <-p.ready:
	default:
		p.misses.Add(1)
		p.poke()
		return nil, false
	}
	p.poke()
	if enc == wire.Binary {
		p.taken.Add(1)
		return batch[:p.binLen:p.binLen], true
	}
	if len(batch) == p.binLen {
		// Prepared while nobody asked for text. Putting it back would let it circle
		// in front of text takers; a gap is harmless.
		p.dropped.Add(1)
		return nil, false
	}
	p.taken.Add(1)
	return batch[p.binLen:], true
}

func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run fills the pools, one goroutine per pool, until ctx ends; it returns nil after
// every filler stopped. Batches still ready then stay available to Take. Calling Run
// twice is an error.
func (b *Batches) Run(ctx context.Context) error {
	b.mu.Lock()
	if b.running {
		b.mu.Unlock()
		return errors.New("pools: Batches.Run called twice")
	}
	b.running = true
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range b.order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.fill(ctx, p)
		}()
	}
	wg.Wait()
	return nil
}

// retryPolicy is the back-off after a failed fill, publish or stream set-up: 20ms,
// doubling up to 2s, each wait between half and all of that so that pools (and
// dispensers) that failed together retry apart.
var retryPolicy = backoff.Policy{Min: 20 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}

// fill is one pool's filler loop.
func (b *Batches) fill(ctx context.Context, p *pool) {
	logger := b.logger.With("pool", p.spec.String())
	ids := make([]int64, p.spec.Size)
	var text []byte // scratch: the text encoding, copied into the exact-size batch
	idle := time.NewTicker(b.cfg.IdleAfter)
	defer idle.Stop()
	lastTaken, lastMisses := p.taken.Load(), p.misses.Load()
	lastTextAsks, lastTextAt := p.textAsks.Load(), time.Now()
	withText := true
	p.withText.Store(true)
	bo := backoff.New(retryPolicy)
	for {
		if m := p.misses.Load(); m != lastMisses {
			lastMisses = m
			b.raise(logger, p)
		}
		if a := p.textAsks.Load(); a != lastTextAsks {
			lastTextAsks, lastTextAt = a, time.Now()
			if !withText {
				withText = true
				p.withText.Store(true)
				logger.Debug("pools: text asked for, preparing text again")
			}
		} else if withText && time.Since(lastTextAt) >= b.cfg.IdleAfter {
			withText = false
			p.withText.Store(false)
			logger.Debug("pools: no text asked for, preparing binary only", "for", b.cfg.IdleAfter)
		}
		target := int(p.target.Load())
		if len(p.ready) < target {
			if err := b.source(ctx, p, ids); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.fillErrors.Add(1)
				msg := err.Error()
				p.lastError.Store(&msg)
				wait := bo.Next()
				if bo.Failures() == 1 {
					logger.Warn("pools: fill failed, retrying with back-off", "err", err, "retry_in", wait)
				} else {
					logger.Debug("pools: fill failed again", "err", err, "retry_in", wait)
				}
				if !backoff.Sleep(ctx, wait) {
					return
				}
				continue
			}
			if bo.Failures() != 0 {
				logger.Info("pools: fill works again")
				bo.Reset()
			}
			var batch []byte
			batch, text = prepare(ids, text, withText)
			// The filler is the only sender and len < target <= Depth = cap, so this
			// send finds room.
			p.ready <- batch
			p.filled.Add(1)
			if len(p.ready) < target/2 {
				continue // drained: refill flat out
			}
			if !backoff.Sleep(ctx, b.cfg.FillPause) {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-idle.C:
			if taken := p.taken.Load(); taken != lastTaken {
				lastTaken = taken
				continue
			}
			b.lower(logger, p)
		}
	}
}

// prepare encodes ids as a ready batch: binary, then (withText) text, in one allocation
// of exactly the size needed. text is scratch space, returned for reuse.
func prepare(ids []int64, text []byte, withText bool) (batch, scratch []byte) {
	if !withText {
		return wire.AppendIDs(make([]byte, 0, 8*len(ids)), ids, wire.Binary), text
	}
	text = wire.AppendIDs(text[:0], ids, wire.Text)
	batch = make([]byte, 0, 8*len(ids)+len(text))
	batch = wire.AppendIDs(batch, ids, wire.Binary)
	return append(batch, text...), text
}

// source fills ids from the pool's generator.
func (b *Batches) source(ctx context.Context, p *pool, ids []int64) error {
	var err error
	if p.spec.Kind == wire.Snowflake {
		err = b.sf.Fill(ids)
	} else {
		err = b.cfg.Segments.Fill(ctx, p.spec.Tag, ids)
	}
	if err != nil {
		return fmt.Errorf("pools: fill %s: %w", p.spec, err)
	}
	return nil
}

// raise doubles the target after a Take found the pool empty.
func (b *Batches) raise(logger *slog.Logger, p *pool) {
	t := p.target.Load()
	if t >= int64(p.spec.Depth) {
		return
	}
	nt := min(2*t, int64(p.spec.Depth))
	p.target.Store(nt)
	logger.Debug("pools: demand, raising target", "from", t, "to", nt)
}

// lower halves the target of an idle pool and drops the ready batches above it.
func (b *Batches) lower(logger *slog.Logger, p *pool) {
	t := p.target.Load()
	nt := max(t/2, 1)
	if nt != t {
		p.target.Store(nt)
		logger.Debug("pools: idle, lowering target", "from", t, "to", nt)
	}
	for len(p.ready) > int(nt) {
		select {
		case <-p.ready:
			p.dropped.Add(1)
		default:
			return // taken meanwhile
		}
	}
}

// PoolStats is a snapshot of one pool. Counts are of batches unless named otherwise.
type PoolStats struct {
	Kind       string `json:"kind"`
	Tag        string `json:"tag"`
	Size       int    `json:"size"`  // IDs per batch
	Depth      int    `json:"depth"` // the most batches kept ready
	Ready      int    `json:"ready"`
	Target     int    `json:"target"` // batches the filler aims to keep ready now, 1..Depth
	Taken      uint64 `json:"taken"`
	Misses     uint64 `json:"misses"` // Takes of the pool's size that found it empty
	Filled     uint64 `json:"filled"`
	Dropped    uint64 `json:"dropped"` // ready batches dropped by an idle pool or as binary-only (a gap in the IDs)
	Text       bool   `json:"text"`    // batches are prepared with text as well as binary
	FillErrors uint64 `json:"fill_errors"`
	LastError  string `json:"last_error,omitempty"`
	// Borrowed is, for snowflake pools, how far the generator's highest issued
	// timestamp is ahead of the clock (0 when it is not, or the source cannot tell).
	Borrowed time.Duration `json:"borrowed_ns"`
}

// Stats returns a snapshot of every pool, in the order of Config.Specs.
func (b *Batches) Stats() []PoolStats {
	borrowed := borrowed(b.sf)
	out := make([]PoolStats, 0, len(b.order))
	for _, p := range b.order {
		s := PoolStats{
			Kind:       p.spec.Kind.String(),
			Tag:        p.spec.Tag,
			Size:       p.spec.Size,
			Depth:      p.spec.Depth,
			Ready:      len(p.ready),
			Target:     int(p.target.Load()),
			Taken:      p.taken.Load(),
			Misses:     p.misses.Load(),
			Filled:     p.filled.Load(),
			Dropped:    p.dropped.Load(),
			FillErrors: p.fillErrors.Load(),
			Text:       p.withText.Load(),
		}
		if e := p.lastError.Load(); e != nil {
			s.LastError = *e
		}
		if p.spec.Kind == wire.Snowflake {
			s.Borrowed = borrowed
		}
		out = append(out, s)
	}
	return out
}
