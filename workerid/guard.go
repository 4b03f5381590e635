package workerid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// ErrClockBehindRecord is returned by Guard.Start when the clock reads earlier than a
// record of timestamps already used (this node's own, or its worker ID's) by more than
// ClockWaitMax: the clock was set back, and issuing now could repeat IDs.
var ErrClockBehindRecord = errors.New("clock is behind the record")

// ErrPeerSkew is returned by Guard.Start at a node's first start when its clock is
// further than PeerSkewMax from the clocks of a strict majority of the running
// dispensers (checkPeers).
var ErrPeerSkew = errors.New("clock disagrees with the peers")

// ErrRecordUnavailable is returned by Guard.Start for a permanent worker ID when the
// forever bucket cannot be read and there is no cache file record either: nothing tells
// which timestamps this node already used.
var ErrRecordUnavailable = errors.New("no readable record")

// Guard defaults.
const (
	DefaultBorrowMax = time.Second // --borrow-max
	// DefaultPeerSkewMax is --peer-skew-max. NTP keeps healthy hosts within milliseconds
	// of each other and a request over NATS adds milliseconds more, so 5 s never trips
	// on a sane clock, while it catches the real faults (a dead RTC, a wrong time zone,
	// an unsynced VM). It is also a bound on harm: a node that starts d ahead and is
	// later corrected must wait about d at its next restart (or refuse, past
	// --clock-wait-max), and a few heartbeats' worth of that is tolerable.
	DefaultPeerSkewMax = 5 * time.Second
	// DefaultPeerWindow is how long the peer check collects answers. Dispensers answer
	// from memory in well under 10 ms on a LAN; 250 ms leaves room for a loaded peer
	// without delaying a first start noticeably.
	DefaultPeerWindow  = 250 * time.Millisecond
	DefaultReadTimeout = 2 * time.Second
)

// TimeSubject is the subject of the peer time check for a prefix ("leaf.time").
func TimeSubject(prefix string) string { return wire.Subjects{Prefix: prefix}.Time() }

// GuardConfig configures a Guard. Start from DefaultGuardConfig.
type GuardConfig struct {
	// NodeID is this dispenser's identity: its key in the forever bucket. Required.
	NodeID string
	// Prefix is the subject prefix; the peer check asks <Prefix>.time ("leaf").
	Prefix string
	// Forever is the forever bucket; nil when the deployment keeps none.
	Forever *Forever
	// Cache is the local cache file; nil when none is kept.
	Cache *CacheFile
	// Conn is used for the peer time check; nil skips it.
	Conn *nats.Conn
	// Clock is the wall clock, the generator's (snowflake.SystemClock()).
	Clock snowflake.Clock
	// HeartbeatInterval (3 s) and BorrowMax (1 s) must be at least the heartbeat's: the
	// floor is record + HeartbeatInterval + BorrowMax, the most the previous run's
	// generator may have been allowed past its record. BorrowMax must also be at least
	// the generator's BorrowMax; a larger value only lengthens the start-up wait, so a
	// generator that does not borrow keeps the default rather than 0.
	HeartbeatInterval time.Duration
	BorrowMax         time.Duration
	// ClockWaitMax is how far behind a record the clock may be at start and be waited
	// out instead of refused (--clock-wait-max, 0), beyond the BorrowMax that borrowed
	// timestamps legitimately put a record ahead (and PeerSkewMax more for a previous
	// holder's record). 0 waits out only that.
	ClockWaitMax time.Duration
	// PeerSkewMax is the largest distance from the peers' clocks accepted at a first
	// start (--peer-skew-max, 5 s): a start is refused when a strict majority of the
	// peers read further than this on one side (the median beyond it, with a quorum).
	PeerSkewMax time.Duration
	// PeerWindow is how long the peer check collects answers (250 ms).
	PeerWindow time.Duration
	// ReadTimeout bounds reading the forever bucket (2 s); on timeout the cache file is
	// used.
	ReadTimeout time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// DefaultGuardConfig returns the defaults: prefix "leaf", the system clock, Leaf's 3 s
// heartbeat, 1 s of borrowing, no extra wait for a clock behind its record, peers within
// 5 s collected for 250 ms, forever bucket reads of at most 2 s. NodeID is left for the
// caller.
func DefaultGuardConfig() GuardConfig {
	return GuardConfig{
		Prefix:            wire.DefaultPrefix,
		Clock:             snowflake.SystemClock(),
		HeartbeatInterval: wire.HeartbeatInterval,
		BorrowMax:         DefaultBorrowMax,
		PeerSkewMax:       DefaultPeerSkewMax,
		PeerWindow:        DefaultPeerWindow,
		ReadTimeout:       DefaultReadTimeout,
	}
}

// Validate reports the first setting that is missing or out of range, naming the field,
// its value and the bound; errors wrap ErrInvalidConfig or ErrInvalidNodeID.
func (c GuardConfig) Validate() error {
	const component = "clock guard"
	if err := CheckNodeID(c.NodeID); err != nil {
		return fmt.Errorf("%s: NodeID: %w", component, err)
	}
	if c.Prefix == "" {
		return invalid(component, "Prefix is empty, want the subject prefix (%q by default)", wire.DefaultPrefix)
	}
	if c.Clock == nil {
		return invalid(component, "Clock is nil, want the generator's clock (snowflake.SystemClock() by default)")
	}
	err := checkPositive(component,
		duration{"HeartbeatInterval", c.HeartbeatInterval}, duration{"BorrowMax", c.BorrowMax},
		duration{"PeerSkewMax", c.PeerSkewMax}, duration{"PeerWindow", c.PeerWindow}, duration{"ReadTimeout", c.ReadTimeout})
	if err != nil {
		return err
	}
	if c.ClockWaitMax < 0 {
		return invalid(component, "ClockWaitMax is %s, want >= 0", c.ClockWaitMax)
	}
	return nil
}

// Guard is the start-up clock check (Leaf's "check the forever node" step, made strict):
// it reads every record of timestamps already used, refuses a clock that is behind them,
// checks a first start against the peers' clocks, and waits until the clock is past the
// most the previous run may have issued.
type Guard struct {
	cfg GuardConfig
}

// newGuard validates cfg and returns a Guard.
func newGuard(cfg GuardConfig) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Guard{cfg: cfg}, nil
}

// recordSource is one record Start consults.
type recordSource struct {
	name string // e.g. "KV leaf_forever/node-1"
	ts   int64
	own  bool // written by this node (its clock), not by a previous holder of the ID
	// ceiling is the most the writer's generator was allowed on the strength of ts
	// (Record.Ceiling); 0 when the record does not say (then ts + this run's margin).
	ceiling int64
	// other is set for this node's own record of another worker ID than the lease's (it
	// held another one before): it still tells whether this clock was set back, but
	// says nothing about the timestamps the lease's worker ID used, so it sets no floor.
	other bool
	// releasedBy is set on the worker ID's record when it is marked released: the run
	// that released it (Record.Instance).
	releasedBy string
}

// borrowed is how far ahead of its clock the record's writer was allowed to borrow:
// this run's BorrowMax, or the writer's own when its record says it was larger.
func (g *Guard) borrowed(s recordSource) time.Duration {
	b := g.cfg.BorrowMax
	if s.ceiling > 0 {
		b = max(b, msDuration(s.ceiling-s.ts)-g.cfg.HeartbeatInterval)
	}
	return b
}

// limit is the highest timestamp the record's writer may have issued: the ceiling it
// recorded, which is exact (its run's interval and borrowing past ts, or ts itself after
// a clean stop), or for a record without one, ts plus the heartbeat interval and this
// run's borrow-max.
func (g *Guard) limit(s recordSource) int64 {
	if s.ceiling > 0 {
		return s.ceiling
	}
	return s.ts + (g.cfg.HeartbeatInterval + g.cfg.BorrowMax).Milliseconds()
}

// covered reports whether a record without a ceiling is vouched for by one with a
// ceiling of the same worker ID and at least its timestamp: the heartbeat writes the
// worker ID's record (with its ceiling) before the registry's, in the same beat, and
// any later beat or run records more, so that ceiling bounds what the writer of s was
// allowed too.
func covered(s recordSource, sources []recordSource) bool {
	if s.ceiling > 0 || s.other {
		return false
	}
	for _, c := range sources {
		if c.ceiling > 0 && !c.other && c.ts >= s.ts {
			return true
		}
	}
	return false
}

// allowance is how far a record may be ahead of the clock without the clock being wrong.
// A record holds the highest timestamp issued, which may have been borrowed up to
// BorrowMax (the writer's, when its record says it was larger) ahead of the clock that
// wrote it, so a quick restart after a clean stop finds its own record ahead by up to
// that much; a previous holder's clock may also differ from ours by up to PeerSkewMax,
// the peer check's bound. Both are waited out, ClockWaitMax on top.
func (g *Guard) allowance(s recordSource) time.Duration {
	a := g.cfg.ClockWaitMax + g.borrowed(s)
	if !s.own {
		a += g.cfg.PeerSkewMax
	}
	return a
}

// Start checks the clock for lease's worker ID before the generator is created and
// returns its Floor: no timestamp <= floor may be issued (0 when there is no record).
//
// It reads this node's record and the worker ID's record (WorkerKey, whoever wrote it:
// the same worker ID under another node ID, or a previous holder) from the forever
// bucket (falling back to the cache file alone when the bucket cannot be read), the
// cache file, and lease.Recorded(). A clock behind one of them is waited out when the
// gap is within its allowance (ClockWaitMax + BorrowMax, or the writer's larger
// borrow-max as its record's ceiling shows, + PeerSkewMax for another node's record)
// and refused with ErrClockBehindRecord otherwise. The floor is the highest of the
// records' limits: R + HeartbeatInterval + BorrowMax for a record R, or the ceiling R
// carries when that is higher (written by a run with a larger borrow-max); this node's
// own records of another worker ID than lease's (it held another before) check the
// clock but set no floor, since a floor guards a worker ID's timestamps. Start waits
// until the clock is past it, so a restart right after a crash never repeats a
// timestamp even if the clock was set back. When the node has no record of its own (a
// first start), its clock is first compared with its peers' (ErrPeerSkew).
//
// Start returns early with ctx's error when ctx ends.
func (g *Guard) Start(ctx context.Context, lease Lease) (floor int64, err error) {
	log := g.cfg.Logger.With("node_id", g.cfg.NodeID, "worker_id", lease.WorkerID())
	sources, own, err := g.readRecords(ctx, lease, log)
	if err != nil {
		return 0, err
	}
	now := g.cfg.Clock.Now().UnixMilli()
	var rec recordSource // the one that sets the floor
	for _, s := range sources {
		if !s.other && !covered(s, sources) && (rec.ts == 0 || g.limit(s) > g.limit(rec)) {
			rec = s
		}
		if s.ts <= now {
			continue
		}
		gap, allowed := msDuration(s.ts-now), g.allowance(s)
		if gap > allowed {
			parts := fmt.Sprintf("clock-wait-max %s + borrow-max %s", g.cfg.ClockWaitMax, g.borrowed(s))
			if !s.own {
				parts += fmt.Sprintf(" + peer-skew-max %s for another node's record", g.cfg.PeerSkewMax)
			}
			return 0, fmt.Errorf("%w: the clock reads %s, %s behind the record %s from %s (allowed %s: %s): the clock was set back; fix it, or raise --clock-wait-max to wait it out",
				ErrClockBehindRecord, fmtMs(now), gap, fmtMs(s.ts), s.name, allowed, parts)
		}
		log.Warn("the clock is behind a record; waiting it out",
			"clock", fmtMs(now), "record", fmtMs(s.ts), "source", s.name, "gap", gap, "allowed", allowed)
	}

	if !own {
		if err := g.checkPeers(ctx, log); err != nil {
			return 0, err
		}
	}
	if rec.ts == 0 {
		log.Info("no record of earlier timestamps: starting without a floor")
		return 0, nil
	}

	floor = g.limit(rec)
	if now = g.cfg.Clock.Now().UnixMilli(); now <= floor {
		// The floor is the record's ceiling when it has one (interval, borrow-max and
		// the lead past it), or the record plus this node's interval and borrow-max.
		log.Info(fmt.Sprintf("waiting %s for the clock to pass the last record's limit (%s from %s; %s past it)",
			msDuration(floor-now+1), fmtMs(rec.ts), rec.name, msDuration(floor-rec.ts)),
			"floor", fmtMs(floor))
	}
	if err := waitPast(ctx, g.cfg.Clock, floor); err != nil {
		return 0, fmt.Errorf("clock guard: waiting to pass the floor %s: %w", fmtMs(floor), err)
	}
	log.Info("clock check passed", "floor", fmtMs(floor), "record", fmtMs(rec.ts), "source", rec.name)
	return floor, nil
}

// readRecords collects the records for Start. own reports whether the node has a record
// of its own (forever bucket, cache file, or a permanent ID's registry record), which
// decides whether the peer check runs.
func (g *Guard) readRecords(ctx context.Context, lease Lease, log *slog.Logger) (sources []recordSource, own bool, err error) {
	kvOK := g.cfg.Forever == nil // nothing to read counts as read
	if f := g.cfg.Forever; f != nil {
		kv, err := g.readForever(ctx, f, lease.WorkerID())
		switch {
		case err == nil:
			kvOK = true
			sources = append(sources, kv...)
		case ctx.Err() != nil:
			return nil, false, fmt.Errorf("clock guard: %w", ctx.Err())
		default:
			log.Warn("forever bucket unreachable: using the cache file alone", "bucket", f.Bucket(), "err", err)
		}
	}
	cacheOK := false
	if c := g.cfg.Cache; c != nil {
		e, err := c.Load()
		switch {
		case err == nil:
			cacheOK = true
			name := "cache file " + c.Path
			if e.NodeID != g.cfg.NodeID {
				// Kept anyway: a higher floor is always safe, a missed one is not.
				name += " (written by node " + e.NodeID + ")"
				log.Warn("cache file was written by another node ID; using its record anyway", "path", c.Path, "cache_node_id", e.NodeID)
			}
			sources = append(sources, recordSource{name: name, ts: e.Timestamp, own: true, ceiling: e.Ceiling, other: e.WorkerID != lease.WorkerID()})
		case errors.Is(err, ErrNoRecord):
		default:
			return nil, false, fmt.Errorf("clock guard: %w (remove the file only if this node never issued IDs, or restore it)", err)
		}
	}
	if cacheOK {
		g.trustCleanStop(sources, lease.WorkerID(), log)
	}
	if !kvOK && !cacheOK && lease.TTL() == 0 {
		return nil, false, fmt.Errorf("%w: the forever bucket cannot be read and there is no cache file record, so nothing tells which timestamps worker ID %d already used; retry when NATS is back",
			ErrRecordUnavailable, lease.WorkerID())
	}
	for _, s := range sources {
		own = own || s.own
	}
	if rt := lease.Recorded(); rt > 0 {
		// A permanent ID is this node's alone, so its registry record is the node's own;
		// a leased one may be a previous holder's, which says little about this clock.
		mine := lease.TTL() == 0
		sources = append(sources, recordSource{name: fmt.Sprintf("the registry's record for worker ID %d", lease.WorkerID()), ts: rt, own: mine})
		own = own || mine
	}
	return sources, own, nil
}

// readForever reads this node's record and worker ID id's record (WorkerKey) from the
// forever bucket; a missing one is no source, and any other error means the bucket
// could not be read. The worker ID's record counts as this node's own only when this
// node wrote it: written by another node ID (this worker ID restarted under another
// name, or a previous holder) it tells what was issued, not how this clock compares.
func (g *Guard) readForever(ctx context.Context, f *Forever, id int64) ([]recordSource, error) {
	rctx, cancel := context.WithTimeout(ctx, g.cfg.ReadTimeout)
	defer cancel()
	var sources []recordSource
	r, err := f.Get(rctx, g.cfg.NodeID)
	switch {
	case err == nil:
		sources = append(sources, recordSource{name: "KV " + f.Bucket() + "/" + g.cfg.NodeID, ts: r.Timestamp, own: true, ceiling: r.Ceiling, other: r.WorkerID != id})
	case !errors.Is(err, ErrNoRecord):
		return nil, err
	}
	w, err := f.GetWorker(rctx, id)
	switch {
	case err == nil:
		name := "KV " + f.Bucket() + "/" + WorkerKey(id)
		if w.NodeID != g.cfg.NodeID {
			name += " (written by node " + w.NodeID + ")"
		}
		s := recordSource{name: name, ts: w.Timestamp, own: w.NodeID == g.cfg.NodeID, ceiling: w.Ceiling}
		if w.Released {
			s.releasedBy = w.Instance
		}
		sources = append(sources, s)
	case !errors.Is(err, ErrNoRecord):
		return nil, err
	}
	// The worker record may have been rewritten since its last holder wrote it (a forged
	// "released", a deletion): every holder's node record keeps the ceiling it was
	// allowed, so the floor is the highest ceiling any record of the worker ID holds.
	others, err := f.nodeRecordsOf(rctx, id, g.cfg.NodeID)
	if err != nil {
		return nil, err
	}
	for _, o := range others {
		sources = append(sources, recordSource{name: "KV " + f.Bucket() + "/" + o.nodeID + " (node " + o.nodeID + "'s record of this worker ID)",
			ts: o.rec.Timestamp, ceiling: o.rec.Ceiling})
	}
	return sources, nil
}

// trustCleanStop lowers the limit of worker ID id's record, released by the run whose
// cache file this is, to what that run issued: a released record keeps its holder's
// ceiling, but this data dir's cache file (one process at a time holds it) says that run
// stopped cleanly with nothing issued past its timestamp, so its own restart need not
// wait the ceiling out. Another holder's records (their nodes' records) still count.
func (g *Guard) trustCleanStop(sources []recordSource, id int64, log *slog.Logger) {
	e, err := g.cfg.Cache.Load()
	if err != nil || e.Instance == "" || e.WorkerID != id || e.NodeID != g.cfg.NodeID || e.Ceiling != e.Timestamp {
		return
	}
	for i, s := range sources {
		if s.releasedBy == e.Instance && s.ceiling > max(s.ts, e.Timestamp) {
			sources[i].ceiling = max(s.ts, e.Timestamp)
			log.Info("the worker record was released by this data dir's previous run, which stopped cleanly: its timestamp is the floor, not its ceiling",
				"record", fmtMs(s.ts), "ceiling", fmtMs(s.ceiling))
		}
	}
}

// checkPeers compares this node's clock with its peers' at a first start: it asks
// $SRV.INFO.<prefix> (every dispenser of this service names its node ID), then
// <prefix>.time (every dispenser answers with its clock and node ID), both through
// client.AskAll's bounds. Only a clock whose node ID $SRV.INFO named counts, once per
// node ID and never this node's own: a responder on <prefix>.time that is not a
// dispenser of this service is no peer, and its answers are read and skipped as they
// come, so that a flood of them cannot fill the bound on answers kept and push out the
// peers' (asking both at once would learn the members too late for that). The verdict
// is the median's, with a quorum: the start is refused only when a strict majority of
// the peers read more than PeerSkewMax away on the same side, so one rogue or broken
// peer cannot keep fresh nodes from starting. Where this node may not ask $SRV (the
// server refuses it), every node ID that answers the time counts once.
func (g *Guard) checkPeers(ctx context.Context, log *slog.Logger) error {
	nc := g.cfg.Conn
	if nc == nil {
		log.Info("first start without a NATS connection: peer time check skipped")
		return nil
	}
	subjects := wire.Subjects{Prefix: g.cfg.Prefix}
	infoSubject, err := micro.ControlSubject(micro.InfoVerb, subjects.Service(), "")
	if err != nil {
		return fmt.Errorf("clock guard: peer time check: %w", err)
	}
	ask := client.AskAll{Prefix: g.cfg.Prefix, Window: g.cfg.PeerWindow, Quiet: g.cfg.PeerWindow}
	filter := clockFilter{self: g.cfg.NodeID, seen: map[string]bool{}}
	infos, err := ask.Do(ctx, nc, nats.NewMsg(infoSubject))
	switch {
	case err == nil:
		filter.members = make(map[string]bool, len(infos.Msgs))
		for _, m := range infos.Msgs {
			if p, err := parsePeer(m.Data); err == nil && wire.CheckNodeID(p.nodeID) == nil {
				filter.members[p.nodeID] = true
			}
		}
	case ctx.Err() == nil && errors.Is(err, nats.ErrPermissionViolation):
		log.Info("peer time check: this node may not ask $SRV for its peers, so every node that answers the time counts", "subject", infoSubject)
	default:
		return fmt.Errorf("clock guard: peer time check: %w", err)
	}
	if filter.members != nil {
		delete(filter.members, g.cfg.NodeID)
		if len(filter.members) == 0 {
			log.Info("peer time check: no other dispenser of this service (first node)", "subject", infoSubject, "window", g.cfg.PeerWindow)
			return nil
		}
		// The members are known: the ask ends once each has answered, and waits for them
		// longer than PeerWindow (8 x) rather than end while it is still reading a flood
		// of strangers' answers on a busy machine, which would leave out the peers'.
		ask.MaxAnswers = len(filter.members)
		ask.Window, ask.Quiet = 8*g.cfg.PeerWindow, 8*g.cfg.PeerWindow
	}
	timeReq := nats.NewMsg(subjects.Time())
	timeReq.Header.Set(wire.NodeIDHeader, g.cfg.NodeID)
	ask.Keep = filter.keep
	sent := g.cfg.Clock.Now()
	clocks, err := ask.Do(ctx, nc, timeReq)
	if err != nil {
		return fmt.Errorf("clock guard: peer time check: %w", err)
	}
	offsets := filter.offsets(clocks, sent)
	if ign := filter.ignored; ign.any() || clocks.Dropped() > 0 || clocks.More && filter.members == nil {
		log.Info("peer time check: answers ignored", "not_unix_ms", ign.notMs, "not_a_dispenser", ign.stranger,
			"repeated_node", ign.repeated, "dropped", clocks.Dropped(), "more", clocks.More)
	}
	n := len(offsets)
	if n == 0 {
		log.Info("peer time check: no other dispenser answered (first node)", "subject", subjects.Time(), "window", g.cfg.PeerWindow)
		return nil
	}
	v := skewVerdict(offsets, g.cfg.PeerSkewMax)
	own := sent.UnixMilli()
	median := own + v.median.Milliseconds()
	if v.refuse {
		return fmt.Errorf("%w: this node's clock reads %s, the median of %d peers' clocks is %s: %s apart, and %d of them read more than peer-skew-max %s %s; fix the clock",
			ErrPeerSkew, fmtMs(own), n, fmtMs(median), v.median.Abs(), max(v.ahead, v.behind), g.cfg.PeerSkewMax, v.side())
	}
	if v.ahead+v.behind > 0 {
		log.Warn("peer time check: a minority of the peers' clocks disagree with this node's beyond peer-skew-max; going by the median",
			"peers", n, "ahead", v.ahead, "behind", v.behind, "peer_skew_max", g.cfg.PeerSkewMax, "peers_median", fmtMs(median))
	}
	log.Info("peer time check passed", "peers", n, "clock", fmtMs(own), "peers_median", fmtMs(median), "difference", v.median.Abs())
	return nil
}

// ignoredClocks counts the time answers the peer check did not use.
type ignoredClocks struct {
	notMs, stranger, repeated int
}

func (i ignoredClocks) any() bool { return i.notMs+i.stranger+i.repeated > 0 }

// clockFilter is AskAll.Keep for the time answers: it keeps the first answer in Unix
// ms of each node ID members holds (every node ID when members is nil), and leaves out
// this node's own, silently, and the rest, counted.
type clockFilter struct {
	self    string
	members map[string]bool
	seen    map[string]bool
	clocks  []int64 // the kept answers' clocks, in the order kept
	ignored ignoredClocks
}

func (f *clockFilter) keep(m *nats.Msg) bool {
	node := m.Header.Get(wire.NodeIDHeader)
	switch {
	case node == f.self:
		return false // our own responder
	case wire.CheckNodeID(node) != nil || (f.members != nil && !f.members[node]):
		f.ignored.stranger++
		return false
	case f.seen[node]:
		f.ignored.repeated++
		return false
	}
	peerMs, err := strconv.ParseInt(strings.TrimSpace(string(m.Data)), 10, 64)
	if err != nil {
		f.ignored.notMs++
		return false
	}
	f.seen[node] = true
	f.clocks = append(f.clocks, peerMs)
	return true
}

// offsets is each kept peer's clock minus this node's: this node's clock taken half-way
// between asking (sent) and reading the answer, where the peer read its clock.
func (f *clockFilter) offsets(kept client.Answers, sent time.Time) []time.Duration {
	out := make([]time.Duration, 0, len(f.clocks))
	for i, peerMs := range f.clocks { // kept.Msgs, in the same order
		mid := sent.Add(kept.After[i] / 2).UnixMilli()
		out = append(out, msDuration(peerMs-mid))
	}
	return out
}

// verdict is the peer check's reading of the peers' offsets.
type verdict struct {
	median        time.Duration // of the offsets (peer minus this node)
	ahead, behind int           // peers more than the bound ahead of this node, behind it
	refuse        bool          // a strict majority is beyond the bound on one side
}

// side says which way the majority of the peers is off.
func (v verdict) side() string {
	if v.ahead > v.behind {
		return "ahead of it"
	}
	return "behind it"
}

// skewVerdict judges offsets (at least one) against bound: the median, and a refusal
// only when a strict majority of the peers read further than bound from this node on
// the same side (which puts the median there too). One peer an hour off among three
// that agree moves nothing; a node whose clock is off disagrees with most peers.
func skewVerdict(offsets []time.Duration, bound time.Duration) verdict {
	s := slices.Clone(offsets)
	slices.Sort(s)
	var v verdict
	if n := len(s); n%2 == 1 {
		v.median = s[n/2]
	} else {
		v.median = s[n/2-1] + (s[n/2]-s[n/2-1])/2
	}
	for _, d := range s {
		switch {
		case d > bound:
			v.ahead++
		case d < -bound:
			v.behind++
		}
	}
	v.refuse = 2*v.ahead > len(s) || 2*v.behind > len(s)
	return v
}

// waitPast returns once clock reads later than ts (Unix ms). It sleeps in short steps so
// that ctx is honoured and a clock step during the wait is noticed.
func waitPast(ctx context.Context, clock snowflake.Clock, ts int64) error {
	const step = 50 * time.Millisecond
	for {
		now := clock.Now().UnixMilli()
		if now > ts {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		clock.Sleep(min(msDuration(ts-now+1), step))
	}
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
