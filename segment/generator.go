package segment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
)

// Generator serves segment IDs for every tag of a Store. Create it with New, start it
// with Run; TryFill and Fill may then be called from any number of goroutines.
type Generator struct {
	cfg     Config
	now     func() time.Time
	log     *slog.Logger
	recheck time.Duration // how often a tag whose store went backwards is read again

	state atomic.Int32
	// tags maps a name to its buffer. The map is never changed once published: writers
	// (refresh, a lookup that found a tag) copy it under mu, so readers need no lock.
	tags atomic.Pointer[map[string]*buffer]

	mu      sync.Mutex         // guards pending, gen and the copy-on-write of tags
	pending map[string]*buffer // tags not in tags, being looked up for a request
	gen     uint64             // counts refreshes

	// behind holds the names of tags whose store was last found below this node's
	// high-water mark. Their loads read the tag before they take a segment: each Take
	// of a store still behind would move its max_id on by a step, and enough of them
	// would carry it past this node's mark into ranges that other dispensers already
	// handed out, where nothing would stop it any more. Keyed by name rather than kept
	// in the buffer, so that a buffer dropped and made again does not forget it.
	behindMu sync.Mutex
	behind   map[string]struct{}

	// rows serializes the takes of one store row, so that each is checked against the
	// marks in the order the store granted them (rowlocks.go).
	rows rowLocks

	runMu    sync.Mutex // guards the fields below; never held while taking another lock
	runCtx   context.Context
	stopping bool
	loaders  sync.WaitGroup

	ready chan struct{} // closed once the first tag list loaded
	done  chan struct{} // closed when Run starts stopping

	errStarting, errStopped error

	loads, loadErrors, lookups, notFound  atomic.Uint64
	waits, waitTimeouts                   atomic.Uint64
	refreshes, refreshErrors, droppedTags atomic.Uint64
	wentBack                              atomic.Uint64
	lastError                             atomic.Pointer[string]
}

// Generator states.
const (
	stateStarting int32 = iota
	stateReady
	stateStopped
)

// retryPolicy is the back-off of background loads and tag list loads: 20ms, doubling,
// each wait between half and all of its ceiling so that tags (and dispensers) that
// failed together do not retry together. The cap bounds how long a tag stays
// unavailable after its store comes back; with it, 10,000 failing tags cost the store
// at most 10,000 attempts a second.
var retryPolicy = backoff.Policy{Min: 20 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}

// behindRecheck is how often a tag whose store went backwards is read again, to notice
// the operator's repair. Slower than retryPolicy.Max on purpose: a repair takes a person, and
// each recheck that finds the store still behind logs an error, so a rewound store
// with thousands of tags in use logs hundreds of lines a second, not thousands.
const behindRecheck = 5 * time.Second

// Stats is a snapshot of the generator's counters, for the service's stats endpoint.
type Stats struct {
	Ready         bool   `json:"ready"`
	Tags          int    `json:"tags"`            // tags with a buffer
	Pending       int    `json:"pending_lookups"` // tags being looked up for a request
	Loads         uint64 `json:"loads"`           // segments taken from the store
	LoadErrors    uint64 `json:"load_errors"`     // failed store calls of loads (each retried)
	Lookups       uint64 `json:"lookups"`         // tags looked up because a request came before the refresh
	NotFound      uint64 `json:"not_found"`       // lookups or loads that found no such tag
	Waits         uint64 `json:"waits"`           // Fill calls that had to wait for the store
	WaitTimeouts  uint64 `json:"wait_timeouts"`   // of which gave up after WaitMax
	Refreshes     uint64 `json:"refreshes"`       // tag list loads
	RefreshErrors uint64 `json:"refresh_errors"`
	DroppedTags   uint64 `json:"dropped_tags"`    // buffers dropped because their tag left the store
	StoreWentBack uint64 `json:"store_went_back"` // loads refused: the store was below this node's mark for the tag (ErrStoreWentBack)
	TagsBehind    int    `json:"tags_behind"`     // tags refused now, until their store is repaired
	LastError     string `json:"last_error,omitempty"`
}

// New checks cfg and returns a Generator; nothing runs until Run.
func New(cfg Config) (*Generator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &Generator{
		cfg:         cfg,
		now:         cfg.Now,
		log:         cfg.Logger,
		recheck:     behindRecheck,
		behind:      make(map[string]struct{}),
		pending:     make(map[string]*buffer),
		ready:       make(chan struct{}),
		done:        make(chan struct{}),
		errStarting: fmt.Errorf("segment: starting, the tag list has not loaded yet: %w", ErrUnavailable),
		errStopped:  fmt.Errorf("segment: stopped: %w", ErrUnavailable),
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	empty := make(map[string]*buffer)
	g.tags.Store(&empty)
	return g, nil
}

// Run loads the tag list (retrying until it succeeds), then refreshes it every
// RefreshInterval, and owns every background loader goroutine; it returns after all of
// them stopped, when ctx ends. It returns nil then, and an error only when called twice.
func (g *Generator) Run(ctx context.Context) error {
	g.runMu.Lock()
	if g.runCtx != nil {
		g.runMu.Unlock()
		return errors.New("segment: Generator.Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	g.runCtx = ctx
	g.runMu.Unlock()
	defer g.stop(cancel)

	for bo := backoff.New(retryPolicy); ; {
		err := g.refresh(ctx)
		if err == nil {
			break
		}
		wait := bo.Next()
		g.log.Warn("segment: first tag list load failed, retrying", "err", err, "retry_in", wait)
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
	g.state.Store(stateReady)
	close(g.ready)

	tick := time.NewTicker(g.cfg.RefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := g.refresh(ctx); err != nil && ctx.Err() == nil {
				// The buffers keep serving; the next tick tries again.
				g.log.Warn("segment: tag list refresh failed", "err", err)
			}
		}
	}
}

// stop refuses new work, wakes every waiting Fill, stops the loaders' store calls and
// waits for the loaders to return.
func (g *Generator) stop(cancel context.CancelFunc) {
	g.state.Store(stateStopped)
	close(g.done)
	g.runMu.Lock()
	g.stopping = true
	g.runMu.Unlock()
	cancel()
	g.loaders.Wait()
}

// Ready is closed once the first tag list load succeeded (before that, TryFill says
// "would wait" and Fill waits for it, at most WaitMax, then returns ErrUnavailable
// "starting"): a dispenser restarted under load takes requests before its tags are in.
func (g *Generator) Ready() <-chan struct{} { return g.ready }

// TryFill fills dst with len(dst) IDs of tag if they are in memory now, without waiting
// and without I/O: ok=false means "would wait" (a tag not yet looked up, a segment
// being loaded), then call Fill from another goroutine; dst holds nothing usable then,
// and IDs it took from the end of a spent segment are skipped (a gap, never a
// duplicate). err is final: ErrInvalidTag, ErrUnavailable when stopped.
// The IDs in dst are strictly increasing. One ID or a whole batch costs one atomic add
// and no allocation. ErrStoreWentBack is final too: the tag's store went backwards, and
// waiting does not help until an operator repairs it.
func (g *Generator) TryFill(tag string, dst []int64) (ok bool, err error) {
	switch s := g.state.Load(); s {
	case stateReady:
	case stateStarting:
		return false, nil // Fill waits for the tag list
	default:
		return false, g.stateErr(s)
	}
	b := (*g.tags.Load())[tag]
	if b == nil || len(dst) == 0 {
		// Only names the store returned are in the map, so a found tag is valid.
		if err := CheckTagName(tag); err != nil {
			return false, err
		}
		return b != nil || len(dst) == 0, nil
	}
	seg := b.cur.Load()
	if seg == nil {
		g.preload(b) // the first load of a tag the refresh listed
		return false, nil
	}
	filled := g.take(b, seg, dst)
	if filled == len(dst) {
		return true, nil
	}
	return g.fillSlow(nil, tag, b, dst, filled, false)
}

// Fill is TryFill that waits (at most WaitMax, or until ctx ends) for the tag lookup or
// the next segment. It returns an error wrapping ErrTagNotFound for a tag the store
// does not have, one wrapping ErrStoreWentBack at once for a tag whose store went
// backwards, and one wrapping ErrUnavailable (and the store's or ctx's error) when it
// gave up waiting.
func (g *Generator) Fill(ctx context.Context, tag string, dst []int64) error {
	if err := g.waitReady(ctx); err != nil {
		return err
	}
	b := (*g.tags.Load())[tag]
	if b == nil || len(dst) == 0 {
		if err := CheckTagName(tag); err != nil {
			return err
		}
		if len(dst) == 0 {
			return nil
		}
	}
	filled := 0
	if b != nil {
		if seg := b.cur.Load(); seg != nil {
			if filled = g.take(b, seg, dst); filled == len(dst) {
				return nil
			}
		}
	}
	_, err := g.fillSlow(ctx, tag, b, dst, filled, true)
	return err
}

// waitReady waits, at most WaitMax, for the first tag list while the generator starts.
func (g *Generator) waitReady(ctx context.Context) error {
	if s := g.state.Load(); s != stateStarting {
		if s != stateReady {
			return g.stateErr(s)
		}
		return nil
	}
	timeout := time.NewTimer(g.cfg.WaitMax)
	defer timeout.Stop()
	select {
	case <-g.ready:
	case <-timeout.C:
	case <-ctx.Done():
	case <-g.done:
	}
	if s := g.state.Load(); s != stateReady {
		return g.stateErr(s)
	}
	return nil
}

func (g *Generator) stateErr(s int32) error {
	if s == stateStopped {
		return g.errStopped
	}
	return g.errStarting
}

// take fills the start of dst from seg with one atomic add and returns how many IDs it
// got: all of dst, or the rest of seg when the add went past its end. The add that
// carries pos past the 10% mark starts the load of the next segment, so exactly one
// caller per segment does it.
func (g *Generator) take(b *buffer, seg *segment, dst []int64) int {
	n := int64(len(dst))
	p := seg.pos.Add(n)
	from := p - n
	if from >= seg.size {
		return 0
	}
	got := min(p, seg.size) - from
	id := seg.start + from
	for i := range dst[:got] {
		dst[i] = id + int64(i)
	}
	if from <= seg.trigger && seg.trigger < p {
		g.preload(b)
	}
	return int(got)
}

// fillSlow completes dst[filled:] when the fast path could not: it switches to the next
// segment, looks the tag up, or (when wait) waits for a load, at most WaitMax.
func (g *Generator) fillSlow(ctx context.Context, tag string, b *buffer, dst []int64, filled int, wait bool) (bool, error) {
	var timeout *time.Timer
	defer func() {
		if timeout != nil {
			timeout.Stop()
		}
	}()
	for {
		if s := g.state.Load(); s != stateReady {
			return false, g.stateErr(s)
		}
		if b == nil {
			if !wait {
				return false, nil // TryFill does no lookups: Fill will
			}
			b = g.join(tag)
		}
		b.mu.Lock()
		if b.notFound {
			err := b.err
			b.mu.Unlock()
			if errors.Is(err, ErrInvalidTag) {
				return false, err // a spelling the store would take for another row
			}
			return false, fmt.Errorf("segment: tag %q: %w", tag, ErrTagNotFound)
		}
		cur := b.cur.Load()
		if (cur == nil || cur.spent()) && b.next != nil {
			// The switch: readers still holding the spent segment overshoot it and come
			// here, where they find the new one.
			cur = b.next
			b.next = nil
			b.cur.Store(cur)
			b.signal()
		}
		if cur != nil && !cur.spent() {
			b.mu.Unlock()
			if filled += g.take(b, cur, dst[filled:]); filled == len(dst) {
				return true, nil
			}
			continue
		}
		if b.dropped {
			// The tag left the store (or its lookup was abandoned): start over from the
			// map, which looks it up again.
			b.mu.Unlock()
			b = nil
			continue
		}
		if b.wentBack {
			// Answer at once: only a repair of the store helps, and the loader, still
			// rechecking, notices it.
			err := b.err
			b.mu.Unlock()
			return false, err
		}
		g.startLoad(b)
		if !wait {
			b.mu.Unlock()
			return false, nil
		}
		changed := b.waitChan()
		b.waiters++
		b.mu.Unlock()
		if timeout == nil {
			g.waits.Add(1)
			timeout = time.NewTimer(g.cfg.WaitMax)
		}
		if err := g.awaitLoad(ctx, tag, b, changed, timeout.C); err != nil {
			return false, err
		}
	}
}

// awaitLoad waits, as one of b's waiters, until b changes, the request's time is up, ctx
// ends or the generator stops; an error carries the load's own failure when there is one.
func (g *Generator) awaitLoad(ctx context.Context, tag string, b *buffer, changed <-chan struct{}, timeout <-chan time.Time) error {
	var err error
	select {
	case <-changed:
	case <-timeout:
		g.waitTimeouts.Add(1)
		err = fmt.Errorf("segment: tag %q: no segment within %v: %w", tag, g.cfg.WaitMax, ErrUnavailable)
	case <-ctx.Done():
		err = fmt.Errorf("segment: tag %q: %w: %w", tag, ErrUnavailable, ctx.Err())
	case <-g.done:
		err = g.errStopped
	}
	b.mu.Lock()
	b.waiters--
	cause := b.err
	b.mu.Unlock()
	if err != nil && cause != nil && err != g.errStopped {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// join returns the buffer of tag: the resident one, the one a concurrent request is
// already looking up, or a new pending one, so that any number of requests for an
// unknown tag cause one store lookup.
func (g *Generator) join(tag string) *buffer {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := (*g.tags.Load())[tag]; b != nil {
		return b
	}
	if b := g.pending[tag]; b != nil {
		return b
	}
	// The name may point into a request's buffer: keep a copy, not the request.
	b := &buffer{name: strings.Clone(tag)}
	g.pending[b.name] = b
	g.lookups.Add(1)
	return b
}

// preload starts loading b's next segment.
func (g *Generator) preload(b *buffer) {
	b.mu.Lock()
	g.startLoad(b)
	b.mu.Unlock()
}

// startLoad starts a loader for b unless one runs, a segment is already waiting, or b is
// dropped. Called with b.mu held.
func (g *Generator) startLoad(b *buffer) {
	if b.loading || b.next != nil || b.dropped {
		return
	}
	b.loading = g.spawn(func(ctx context.Context) { g.load(ctx, b) })
}

// spawn runs f in a goroutine that Run waits for, unless Run is not running.
func (g *Generator) spawn(f func(ctx context.Context)) bool {
	g.runMu.Lock()
	defer g.runMu.Unlock()
	if g.runCtx == nil || g.stopping {
		return false
	}
	ctx := g.runCtx
	g.loaders.Add(1)
	go func() {
		defer g.loaders.Done()
		f(ctx)
	}()
	return true
}

// load takes one segment for b from the store, retrying with back-off until it gets
// one, the tag turns out not to exist, b is dropped, nobody waits for a pending lookup
// any more, or ctx ends.
func (g *Generator) load(ctx context.Context, b *buffer) {
	for bo := backoff.New(retryPolicy); ; {
		b.mu.Lock()
		if b.dropped {
			b.loading = false
			b.signal()
			b.mu.Unlock()
			return
		}
		step := int64(0) // the first load uses the stored step, as Leaf does
		if b.loaded {
			step = nextStep(b.step, b.minStep, g.now().Sub(b.lastLoad), g.cfg.SegmentDuration, g.cfg.MaxStep)
		}
		b.mu.Unlock()

		callCtx, cancel := context.WithTimeout(ctx, g.cfg.LoadTimeout)
		began := time.Now()
		err := g.loadOnce(callCtx, b, step)
		b.loadNanos.Add(int64(time.Since(began)))
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			b.mu.Lock()
			b.loading = false
			b.mu.Unlock()
			return
		}
		if errors.Is(err, ErrTagNotFound) || errors.Is(err, ErrInvalidTag) {
			g.forget(b, err)
			return
		}
		wait := bo.Next()
		if errors.Is(err, ErrStoreWentBack) {
			wait = g.recheck // read again, never a blind retry: see the marks check
		}
		if g.failed(b, err, wait) {
			return
		}
		if !backoff.Sleep(ctx, wait) {
			b.mu.Lock()
			b.loading = false
			b.mu.Unlock()
			return
		}
	}
}

// loadOnce takes one segment for b from the store, checks it against the tag's mark
// (recording the new mark durably) and installs it. The first load of a tag that was
// not in the store's list (a lookup) reads the row first, to check the spelling: a tag
// is served only by its stored bytes (CheckSpelling), so no segment is taken, no mark
// raised and no buffer kept for a spelling the store's collation takes for another
// row. A tag already known by its exact bytes is never checked again.
func (g *Generator) loadOnce(ctx context.Context, b *buffer, step int64) error {
	b.mu.Lock()
	lookup := !b.resident && !b.loaded
	b.mu.Unlock()
	if lookup {
		t, err := g.cfg.Store.Tag(ctx, b.name)
		if err != nil {
			return err
		}
		if err := CheckSpelling(b.name, t.Name); err != nil {
			return err
		}
	}
	seg, used, stored, err := g.takeChecked(ctx, b.name, step)
	if err != nil {
		return err
	}
	g.install(b, seg, used, stored)
	return nil
}

// guard is where the high-water marks keep a store that went backwards from repeating
// IDs: a segment of tag name (stored as the store names it) starting below the tag's
// mark is refused with ErrStoreWentBack, and any other segment's end becomes the mark,
// durably, before the segment may be served, so that after a crash the mark covers
// every ID this node could have handed out. Without Marks it lets everything through.
func (g *Generator) guard(name, stored string, seg *segment) error {
	marks := g.cfg.Marks
	if marks == nil {
		return nil
	}
	// The store's own name is the key, and the only spelling served (CheckSpelling).
	if err := CheckSpelling(name, stored); err != nil {
		return err
	}
	mark := marks.Mark(stored)
	if seg.start < mark {
		return g.storeWentBack(name, mark, fmt.Sprintf("the store granted the segment [%d, %d)", seg.start, seg.start+seg.size))
	}
	if seg.size > 0 {
		if err := marks.Raise(stored, seg.start+seg.size); err != nil {
			return fmt.Errorf("segment: tag %q: record the high-water mark %d before serving: %w", name, seg.start+seg.size, err)
		}
	}
	g.behindMu.Lock()
	_, was := g.behind[name]
	delete(g.behind, name)
	g.behindMu.Unlock()
	if was {
		g.log.Info("segment: the store is at or above the high-water mark again; the tag is served", "tag", name, "mark", mark, "segment_start", seg.start)
	}
	return nil
}

// isBehind reports whether tag's store was last found below its mark.
func (g *Generator) isBehind(tag string) bool {
	g.behindMu.Lock()
	defer g.behindMu.Unlock()
	_, ok := g.behind[tag]
	return ok
}

// recheckStore reads a tag whose store was behind its mark, and returns
// ErrStoreWentBack while it still is, so that no segment is taken until it is not.
func (g *Generator) recheckStore(ctx context.Context, tag string) error {
	t, err := g.cfg.Store.Tag(ctx, tag)
	if err != nil {
		return err
	}
	if mark := g.cfg.Marks.Mark(t.Name); t.MaxID < mark {
		return g.storeWentBack(tag, mark, fmt.Sprintf("the store's max_id is %d", t.MaxID))
	}
	return nil
}

// storeWentBack counts, logs and returns one finding that tag's store is below its
// mark. Each finding is logged at error level, not only the first: IDs are at stake
// until an operator repairs the store, and the log is where they look.
func (g *Generator) storeWentBack(tag string, mark int64, found string) error {
	g.wentBack.Add(1)
	g.behindMu.Lock()
	g.behind[tag] = struct{}{}
	g.behindMu.Unlock()
	repair := fmt.Sprintf("dispenser tag update --tag %s --max-id N", tag)
	g.log.Error("segment: the store went backwards; the tag is refused until its max_id is raised",
		"tag", tag, "found", found, "mark", mark, "repair", repair)
	return fmt.Errorf("segment: tag %q: %w: %s, below %d, this dispenser's mark: run %s, N at least %d and every dispenser's mark (docs/errors.md#store-went-back)",
		tag, ErrStoreWentBack, found, mark, repair, mark)
}

// install makes seg (of step used, the tag's stored step being stored) b's current
// segment (when there is none or it is spent) or its next one, and records the step
// state.
func (g *Generator) install(b *buffer, seg *segment, used, stored int64) {
	now := g.now()
	b.mu.Lock()
	if b.dropped {
		// Discarded (a gap): a request that moves on from a dropped buffer takes its
		// next IDs from a new buffer whose loads all started after the drop, and must
		// not find a later range here first.
		b.loading = false
		b.signal()
		b.mu.Unlock()
		return
	}
	if b.err != nil {
		g.log.Info("segment: loads work again", "tag", b.name)
	}
	b.step, b.minStep, b.lastLoad, b.loaded = used, max(stored, 1), now, true
	b.err, b.loading, b.wentBack = nil, false, false
	b.loads++
	b.loadedIDs += seg.size
	if cur := b.cur.Load(); cur == nil || cur.spent() {
		b.cur.Store(seg)
	} else {
		b.next = seg
	}
	b.signal()
	promote := !b.resident && !b.dropped
	b.mu.Unlock()
	g.loads.Add(1)
	if promote {
		g.promote(b)
	}
}

// promote moves a looked-up tag from pending into the map, unless a refresh got there
// first.
func (g *Generator) promote(b *buffer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending[b.name] != b {
		return
	}
	delete(g.pending, b.name)
	old := *g.tags.Load()
	next := make(map[string]*buffer, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[b.name] = b
	b.mu.Lock()
	b.resident, b.gen = true, g.gen
	b.mu.Unlock()
	g.tags.Store(&next)
}

// forget drops a tag the store says does not exist (never created, or deleted), and
// answers its waiters ErrTagNotFound. The next request looks it up again: nothing is
// cached about missing tags, so a tag added by anyone is served when first asked for.
func (g *Generator) forget(b *buffer, err error) {
	g.notFound.Add(1)
	// Nor is a missing tag behind its mark: should it come back, its first segment is
	// checked against the mark like any other.
	g.behindMu.Lock()
	delete(g.behind, b.name)
	g.behindMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending[b.name] == b {
		delete(g.pending, b.name)
	}
	if old := *g.tags.Load(); old[b.name] == b {
		next := make(map[string]*buffer, len(old))
		for k, v := range old {
			if k != b.name {
				next[k] = v
			}
		}
		g.tags.Store(&next)
		g.log.Info("segment: tag no longer in the store", "tag", b.name)
	}
	b.mu.Lock()
	b.notFound, b.dropped, b.loading, b.resident = true, true, false, false
	b.err = err
	b.signal()
	b.mu.Unlock()
}

// failed records a failed load and reports whether the loader should stop: b was
// dropped, or it is a lookup nobody waits for any more (so that requests for many
// unknown tags during an outage leave no retrying goroutines behind). A load refused
// because the store went backwards (already logged and counted) makes requests fail at
// once instead of waiting.
func (g *Generator) failed(b *buffer, err error, retryIn time.Duration) (stop bool) {
	wentBack := errors.Is(err, ErrStoreWentBack)
	if !wentBack {
		g.loadErrors.Add(1)
	}
	msg := err.Error()
	g.lastError.Store(&msg)
	g.mu.Lock()
	defer g.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil && !wentBack {
		g.log.Warn("segment: load failed, retrying with back-off", "tag", b.name, "err", err, "retry_in", retryIn)
	}
	if !wentBack {
		b.loadErrors++
	}
	b.err, b.wentBack = err, wentBack
	b.signal()
	if !b.resident && !b.dropped && b.waiters == 0 && g.pending[b.name] == b {
		delete(g.pending, b.name)
		b.dropped = true
	}
	if b.dropped {
		b.loading = false
		return true
	}
	return false
}

// refresh reloads the tag list: listed tags keep (or get) a buffer and their stored
// step as the floor of the dynamic step; unlisted ones are dropped, except those a
// lookup found while the list was being read.
func (g *Generator) refresh(ctx context.Context) error {
	g.mu.Lock()
	g.gen++
	gen := g.gen
	g.mu.Unlock()

	callCtx, cancel := context.WithTimeout(ctx, g.cfg.LoadTimeout)
	list, err := g.cfg.Store.Tags(callCtx)
	cancel()
	// Counted once applied, so that whoever sees the count sees the new map.
	defer g.refreshes.Add(1)
	if err != nil {
		g.refreshErrors.Add(1)
		msg := err.Error()
		g.lastError.Store(&msg)
		return fmt.Errorf("segment: refresh tag list: %w", err)
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.tags.Load()
	next := make(map[string]*buffer, len(list))
	added, dropped := 0, 0
	for _, t := range list {
		b := old[t.Name]
		if b == nil {
			if b = g.pending[t.Name]; b != nil {
				delete(g.pending, t.Name)
			}
		}
		if b == nil {
			b = &buffer{name: t.Name}
			added++
		}
		b.mu.Lock()
		b.resident = true
		if b.loaded && t.Step >= 1 {
			b.minStep = t.Step
		}
		b.mu.Unlock()
		next[t.Name] = b
	}
	for name, b := range old {
		if _, ok := next[name]; ok {
			continue
		}
		b.mu.Lock()
		if b.gen >= gen {
			next[name] = b // found by a lookup after the list was read
		} else {
			b.dropped, b.resident = true, false
			b.signal()
			dropped++
		}
		b.mu.Unlock()
	}
	g.tags.Store(&next)
	g.droppedTags.Add(uint64(dropped))
	if added > 0 || dropped > 0 {
		g.log.Info("segment: tag list refreshed", "tags", len(next), "added", added, "dropped", dropped)
	}
	return nil
}

// Stats returns a snapshot of the counters.
func (g *Generator) Stats() Stats {
	g.mu.Lock()
	tags, pending := len(*g.tags.Load()), len(g.pending)
	g.mu.Unlock()
	s := Stats{
		Ready:         g.state.Load() == stateReady,
		Tags:          tags,
		Pending:       pending,
		Loads:         g.loads.Load(),
		LoadErrors:    g.loadErrors.Load(),
		Lookups:       g.lookups.Load(),
		NotFound:      g.notFound.Load(),
		Waits:         g.waits.Load(),
		WaitTimeouts:  g.waitTimeouts.Load(),
		Refreshes:     g.refreshes.Load(),
		RefreshErrors: g.refreshErrors.Load(),
		DroppedTags:   g.droppedTags.Load(),
		StoreWentBack: g.wentBack.Load(),
	}
	g.behindMu.Lock()
	s.TagsBehind = len(g.behind)
	g.behindMu.Unlock()
	if msg := g.lastError.Load(); msg != nil {
		s.LastError = *msg
	}
	return s
}
