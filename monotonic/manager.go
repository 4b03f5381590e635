package monotonic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
)

// Manager serves the monotonic tags of one dispenser: it watches the marks, competes
// for the lease of every marked tag, serves the tags it leads from one in-order
// sequence each, and forwards the requests of the others to their leaders. Create it
// with New; it serves once Run has loaded the marks and leases (Ready).
type Manager struct {
	cfg     Config
	log     *slog.Logger
	nc      *nats.Conn
	opts    jetstream.KeyValue // <prefix>_tagopts
	leaders jetstream.KeyValue // <prefix>_leaders
	// optsCfg and leadersCfg create the buckets, at New and again should one be lost
	// (deleted, or a JetStream that lost its store): see watch.
	optsCfg, leadersCfg jetstream.KeyValueConfig
	subjects            wire.Subjects
	// instance is this dispenser's $SRV instance ID (Config.ServiceID), set when Run
	// starts, before any lease is written or compared.
	instance string
	clock    func() time.Time
	base     time.Time
	memory   *memory // the tags this dispenser treated as monotonic (memory.go)

	marks   atomic.Pointer[markSet]
	ranges  atomic.Pointer[rangeSet]             // the tags' ranges, for the request path (ranges.go)
	states  atomic.Pointer[map[string]*tagState] // copy of tags, for the request path
	ready   chan struct{}
	isReady atomic.Bool
	refused atomic.Uint64 // forwarded requests whose reply subject was refused

	// applied is the revision of <prefix>_tagopts up to which the view holds every
	// write; presenceKick wakes the presence loop when it grows (presence.go).
	applied      atomic.Uint64
	presenceKick chan struct{}
	// busy is, per tag marked while this dispenser ran, when it took the mark in, for
	// the tags it had served as ordinary tags (Config.SegmentMarks); its presence record lists
	// them for a lease TTL. Guarded by mu.
	busy map[string]time.Duration

	checkMu sync.Mutex
	checks  map[string]instanceCheck // $SRV answers by instance (verify.go)

	mu       sync.Mutex
	optState map[string]bool          // per key of <prefix>_tagopts: its monotonic value; no entry: no value (absent, deleted)
	markRev  map[string]uint64        // per key of <prefix>_tagopts: the revision of its value
	optRange map[string]optValue      // per key of <prefix>_tagopts: the range its value gives (ranges.go)
	recorded map[string]wire.TagRange // the deployment record's ranges (SetRecordedRanges)
	// remembering is, per tag, the range being written to the memory; writingBack the
	// tags whose range is being written back; refusedRanges the last refusal logged
	// per tag (ranges.go).
	remembering   map[string]wire.TagRange
	writingBack   map[string]bool
	refusedRanges map[string]string
	tags          map[string]*tagState     // tags with a campaign
	holders       map[string]*holder       // the last lease record seen per key
	ended         map[string]chan struct{} // per tag, closed when its last campaign returned
	runCtx        context.Context
	stopping      bool
	wg            sync.WaitGroup
}

// tagState is one monotonic tag on this dispenser: the lease as last seen, this
// dispenser's term when it leads, and its forwarder when it does not.
type tagState struct {
	name   string
	holder atomic.Pointer[holder]
	term   atomic.Pointer[term]
	poke   chan struct{} // one token: the lease record changed, or its leader did not answer
	fwd    forwarder
	ctx    context.Context // the campaign's: ends when the tag is no longer monotonic here
	cancel context.CancelFunc
	done   chan struct{} // closed when the campaign returned
	// settleUntil is, for a tag marked while this dispenser ran, when every dispenser
	// has surely taken the mark in and answered the ordinary requests it took before:
	// no term serves before it, unless every dispenser confirmed the mark at revision
	// settleRev and none had served the tag (presence.go).
	settleUntil time.Duration
	settleRev   uint64
	// changed fires whenever what a waiting request depends on changed: the lease
	// record, this dispenser's term, the leader's verification.
	changed signal
	// verified is the leader term (instance and subject) that was verified (verify.go).
	verified atomic.Pointer[leaseID]
	// unreachable is the revision of the lease record whose leader did not answer (no
	// subscriber on its inbox, or no $SRV answer): a candidate need not wait a whole
	// TTL of silence to take it over (campaign.go).
	unreachable atomic.Uint64
	// passed is the highest ID of the tag this dispenser handed out: served by its own
	// terms, or relayed from a leader. A leader's answer must lie above what was passed
	// on before it was asked (forward.go).
	passed atomic.Int64

	acquireFailures int           // the campaign's: failed attempts in a row, to log once per streak
	verifyWarned    time.Duration // the campaign's: when a failed verification was last logged

	terms, forwarded, forwardErrors, forwardMessages atomic.Uint64
	refusedAnswers, unverified                       atomic.Uint64
	answerWarned                                     atomic.Int64 // when a refused answer was last logged
}

// signal is a broadcast: wait returns a channel that the next fire closes.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// raise sets a to v when v is higher.
func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// New validates cfg and opens (creating when missing) the two buckets. It fails when
// <prefix>_leaders exists for another lease TTL than cfg.LeaseTTL: every dispenser of
// a deployment must use the same. Nothing runs until Run.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if need := int64(cfg.MaxForward) * 8; need > cfg.Conn.MaxPayload() {
		return nil, fmt.Errorf("monotonic: config: MaxForward %d IDs need %d bytes, but the NATS server's max_payload is %d", cfg.MaxForward, need, cfg.Conn.MaxPayload())
	}
	mem, err := openMemory(cfg.MemoryFile)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:           cfg,
		log:           cfg.Logger,
		nc:            cfg.Conn,
		subjects:      wire.Subjects{Prefix: cfg.Prefix},
		clock:         cfg.Now,
		memory:        mem,
		ready:         make(chan struct{}),
		presenceKick:  make(chan struct{}, 1),
		checks:        make(map[string]instanceCheck),
		optState:      make(map[string]bool),
		markRev:       make(map[string]uint64),
		optRange:      make(map[string]optValue),
		remembering:   make(map[string]wire.TagRange),
		writingBack:   make(map[string]bool),
		refusedRanges: make(map[string]string),
		busy:          make(map[string]time.Duration),
		tags:          make(map[string]*tagState),
		holders:       make(map[string]*holder),
		ended:         make(map[string]chan struct{}),
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.clock == nil {
		m.clock = time.Now
	}
	m.base = m.clock()
	// The remembered tags are monotonic from the start, whatever the bucket says.
	m.marks.Store(newMarkSet(mem.all()))
	m.ranges.Store(&rangeSet{})
	m.states.Store(&map[string]*tagState{})
	m.optsCfg = jetstream.KeyValueConfig{
		Bucket:      m.subjects.Bucket(wire.BucketTagOpts),
		Description: "leafbus: segment tag options leaf_alloc has no column for (monotonic), by tag",
		History:     5,
		Replicas:    cfg.Replicas,
	}
	m.leadersCfg = jetstream.KeyValueConfig{
		Bucket:      m.subjects.Bucket(wire.BucketLeaders),
		Description: "leafbus: leases of the leaders of monotonic tags, by tag; records live twice the lease TTL",
		TTL:         recordTTL(cfg.LeaseTTL),
		Replicas:    cfg.Replicas,
	}
	if m.opts, err = kvbucket.Open(ctx, cfg.JetStream, m.optsCfg); err != nil {
		return nil, fmt.Errorf("monotonic: %w", err)
	}
	if m.leaders, err = kvbucket.Open(ctx, cfg.JetStream, m.leadersCfg); err != nil {
		return nil, fmt.Errorf("monotonic: %w", err)
	}
	st, err := m.leaders.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("monotonic: read status of KV bucket %s: %w", m.leaders.Bucket(), err)
	}
	if st.TTL() != recordTTL(cfg.LeaseTTL) {
		return nil, fmt.Errorf("--monotonic-lease-ttl %v: the deployment's is %v (KV bucket %s): use the same on every dispenser (docs/errors.md#monotonic-lease-ttl)",
			cfg.LeaseTTL, st.TTL()/2, m.leaders.Bucket())
	}
	return m, nil
}

// recordTTL is the TTL of the <prefix>_leaders bucket: twice the lease TTL, so that a
// record nobody renews is still there when the others may take it over (after a TTL
// of silence) by a compare-and-set on its revision. Expiry only collects what nobody
// took; safety never depends on when, or whether, the server expires a record.
func recordTTL(lease time.Duration) time.Duration { return 2 * lease }

// now is the time on the Manager's clock since New; with time.Now it is monotonic.
func (m *Manager) now() time.Duration { return m.clock().Sub(m.base) }

// Ready is closed once Run has loaded the marks and the leases; before, every segment
// request is answered 503 (a tag's mark is not known yet).
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// errNotReady is the answer before Ready and after Run.
var errNotReady = fmt.Errorf("%w: monotonic: the monotonic tag marks are not loaded", wire.ErrUnavailable)

// IsMonotonic reports whether tag is marked monotonic. It costs a map lookup and never
// waits; it fails with a 503 until the marks are loaded.
func (m *Manager) IsMonotonic(tag string) (bool, error) {
	if !m.isReady.Load() {
		return false, errNotReady
	}
	return m.marks.Load().lookup(tag)
}

// TryFill fills dst with the next IDs of tag when this dispenser leads it and has them
// in memory, without waiting; ok=false means Fill must be called (from a goroutine that
// may wait), and dst holds nothing then.
func (m *Manager) TryFill(tag string, dst []int64) (ok bool, err error) {
	ts := (*m.states.Load())[tag]
	if ts == nil {
		return false, nil
	}
	t := ts.term.Load()
	if t == nil || !t.serving(m.now()) {
		return false, nil
	}
	n, _, err := t.seq.take(dst, true)
	if err != nil || n < len(dst) {
		return false, nil
	}
	t.served.Add(1)
	return true, nil
}

// Fill fills dst with the next IDs of a monotonic tag: from this dispenser's sequence
// when it leads the tag, else from the leader, through a forwarded request. A request
// that finds no leader to serve it (a hand-over under way, this dispenser's new term
// waiting out the previous one, a leader not verified yet, a leader that no longer
// answers) waits for the next one until ctx ends (WaitMax when ctx has no deadline),
// and is answered 503 only then. The IDs are strictly increasing and above
// every ID of the tag in any reply received before the request was sent.
func (m *Manager) Fill(ctx context.Context, tag string, dst []int64) error {
	ts := (*m.states.Load())[tag]
	if ts == nil {
		return fmt.Errorf("%w: monotonic: tag %q has no leader yet", wire.ErrUnavailable, tag)
	}
	if t := ts.term.Load(); t != nil && t.serving(m.now()) {
		fctx, cancel := context.WithTimeout(ctx, m.cfg.WaitMax)
		err := m.fillTerm(fctx, ts, t, dst)
		cancel()
		if !errors.Is(err, errNotServing) && !errors.Is(err, errTermEnded) {
			return err
		}
		// The term ended meanwhile: wait for the next leader, as below.
	}
	wait := m.cfg.WaitMax
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	return m.queued(ctx, ts, dst, wait)
}

// FillAsyncWithin is Fill for a caller that must not wait (the service's delivery
// goroutine): it calls done exactly once, at once or on another goroutine, after
// filling dst, which it owns until then, and within wait (plus a scheduling moment): a
// request that finds no leader to serve it waits for the next one that long, then gets
// a 503. A waiting or forwarded request holds no goroutine of its own: the tag's
// senders (at most MaxInFlight) carry them all, and one forwarded message answers all
// the requests it carried.
func (m *Manager) FillAsyncWithin(tag string, dst []int64, wait time.Duration, done func(error)) {
	ts := (*m.states.Load())[tag]
	if ts == nil {
		done(fmt.Errorf("%w: monotonic: tag %q has no leader yet", wire.ErrUnavailable, tag))
		return
	}
	if t := ts.term.Load(); t != nil && t.serving(m.now()) {
		// This dispenser leads, and TryFill found no IDs in memory: wait for the segment
		// on a goroutine of the Manager (rare: the sequence fetches ahead).
		if !m.spawn(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, min(wait, m.cfg.WaitMax))
			defer cancel()
			done(m.fillTerm(ctx, ts, t, dst))
		}) {
			done(errNotReady)
		}
		return
	}
	if !m.enqueue(ts, &pending{dst: dst, done: done, deadline: m.now() + wait}) {
		ts.forwardErrors.Add(1)
		done(errNotReady)
	}
}

// spawn runs f in a goroutine that Run waits for, unless Run is not running.
func (m *Manager) spawn(f func(ctx context.Context)) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.spawnLocked(f)
}

// spawnLocked is spawn with mu held.
func (m *Manager) spawnLocked(f func(ctx context.Context)) bool {
	if m.runCtx == nil || m.stopping {
		return false
	}
	ctx := m.runCtx
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f(ctx)
	}()
	return true
}
