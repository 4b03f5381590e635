package monotonic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/wire"
)

// releaseTimeout bounds writing the released record when a leader stops.
const releaseTimeout = 2 * time.Second

// rememberPolicy is the back-off of a campaign whose tag cannot be written to the
// memory file.
var rememberPolicy = backoff.Policy{Min: 50 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}

// campaign is one monotonic tag's life on this dispenser until ctx ends: remember the
// tag's mark (durably, before each attempt to lead), take the lease when it is free (or
// surely over), lead while it holds it, follow otherwise, verifying each leader it
// follows. A campaign started by a live lease record alone, before the tag's mark
// arrived, remembers the mark on the attempt the mark's arrival pokes.
func (m *Manager) campaign(ctx context.Context, ts *tagState) {
	var own uint64 // the revision of our own record after a term ended; 0: none known
	retry := time.NewTimer(0)
	defer retry.Stop()
	for ctx.Err() == nil {
		if !m.remember(ctx, ts.name) {
			return
		}
		t, wait := m.tryAcquire(ctx, ts, own)
		if t != nil {
			own = m.lead(ctx, ts, t)
			continue
		}
		own = 0
		if h := ts.holder.Load(); m.leaderKnown(h) && !m.verifyHolder(ctx, ts, h) {
			// Not a live dispenser of this deployment: no request goes there, and once
			// the record stays unchanged for 2 renewals it is taken over (tryAcquire).
			ts.unreachable.Store(h.rev)
			wait = min(wait, m.cfg.retryInterval())
		}
		if !retry.Stop() {
			select {
			case <-retry.C:
			default:
			}
		}
		retry.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
		case <-ts.poke:
		case <-retry.C:
		}
	}
}

// remember writes a marked tag into the memory file before this dispenser acts on the
// mark, retrying until it is written or ctx ends (false). A tag monotonic by a live
// lease record alone is not remembered: it is followed while the record lives.
func (m *Manager) remember(ctx context.Context, name string) bool {
	bo := backoff.New(rememberPolicy)
	for {
		err := m.syncMemory(name)
		if err == nil {
			return true
		}
		if bo.Failures() == 0 {
			m.log.Error("monotonic: cannot remember a monotonic tag in the data dir; it is neither led nor forwarded until it is, retrying", "tag", name, "err", err)
		}
		if !bo.Wait(ctx) {
			return false
		}
	}
}

// tryAcquire takes the tag's lease if the view says it may be had, and returns the new
// term; else it returns how long to wait before looking again. Every write but a
// create is a compare-and-set on the revision the view holds, so it succeeds only if
// nobody wrote the key since:
//   - own, the revision of a record of ours whose term ended: nobody else led since;
//   - a released record: its leader stopped serving before it wrote it (or nobody ever
//     led: SetMonotonic writes one for a tag it marks);
//   - a record this dispenser has seen unchanged for a whole lease TTL (its own TTL,
//     never the record's ttl_ms): its leader's last renewal was sent before it was seen,
//     so it stopped serving half a TTL later, half a TTL ago by now;
//   - a record whose leader no longer answers (no subscriber on its inbox, or no $SRV
//     answer) and that has been seen unchanged for 2 renewals: the term serves from half
//     a TTL after the record was first seen, when its leader has surely stopped;
//   - absent or deleted (no record says when its leader last renewed): a create-only
//     write, fenced (see acquire).
//
// A tag monotonic only by a live record (no mark) is never taken: followOnly.
func (m *Manager) tryAcquire(ctx context.Context, ts *tagState, own uint64) (*term, time.Duration) {
	h := ts.holder.Load()
	now := m.now()
	if !m.mayLead(ts.name) {
		if h.live() && h.rec.Instance == m.instance {
			return nil, m.giveBack(ctx, ts, h)
		}
		return nil, m.followOnly(ts, h, now)
	}
	var rev uint64
	var notBefore time.Duration
	fenced := true
	switch {
	case own != 0 && (h == nil || h.rev <= own):
		rev, fenced = own, false
	case h == nil || h.gone: // no record: a fenced create
	case h.rec.Released || h.rec.Instance == m.instance:
		rev, fenced = h.rev, false
	default:
		silent := now - h.seen
		unreachable := ts.unreachable.Load() == h.rev
		switch {
		case silent >= m.cfg.LeaseTTL:
			rev, fenced = h.rev, false
		case unreachable && silent >= 2*m.cfg.RenewInterval:
			rev, fenced, notBefore = h.rev, false, h.seen+m.cfg.LeaseTTL/2
		case unreachable:
			return nil, h.seen + 2*m.cfg.RenewInterval - now
		default:
			return nil, h.seen + m.cfg.LeaseTTL - now
		}
	}
	t, err := m.acquire(ctx, ts, rev, fenced, notBefore)
	switch {
	case err == nil:
		ts.acquireFailures = 0
		return t, 0
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		// Lost a race, or the view is behind the bucket (a watch that lags; a record
		// that expired, which no watch reports): look at the key itself, and at once
		// when it says something new.
		if m.refreshHolder(ctx, ts) {
			return nil, 0
		}
	case ctx.Err() == nil:
		if ts.acquireFailures++; ts.acquireFailures == 1 {
			m.log.Warn("monotonic: cannot take the lease, retrying", "tag", ts.name, "err", err, "retry_every", m.cfg.retryInterval())
		}
	}
	return nil, m.cfg.retryInterval()
}

// followOnly is the campaign of a tag monotonic only because its lease record is live
// (no mark says so: a lost <prefix>_tagopts that nobody wrote back yet, or a tag just
// marked ordinary whose leader has not released it). The record is followed, never
// taken; once it is seen unchanged for a whole lease TTL its leader has stopped, the
// record is no longer live, and the tag is no longer monotonic here (reconcile).
func (m *Manager) followOnly(ts *tagState, h *holder, now time.Duration) time.Duration {
	if !h.live() {
		return m.cfg.retryInterval() // reconcile ends the campaign
	}
	if silent := now - h.seen; silent < m.cfg.LeaseTTL {
		return m.cfg.LeaseTTL - silent
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holders[ts.name] == h {
		stale := *h
		stale.stale = true
		m.setHolder(ts.name, h, &stale)
	}
	return m.cfg.retryInterval()
}

// giveBack writes a released record over h, a live record of this dispenser's own for a
// tag it may not lead. No term of this dispenser serves under it (a campaign asks only
// between terms, and a tag's campaigns run one after another), so its leader has
// stopped serving, and the record is released as a leader that stops releases its own:
// a compare-and-set on its revision. Such a record comes from a lease write whose answer
// did not come back but which was stored: its campaign ended while it was under way
// (this dispenser took a released lease just before it saw the tag marked ordinary, its
// marks watch lagging its leases watch), or it timed out and the mark came meanwhile.
// Left alone, it would keep the tag monotonic on every dispenser for a lease TTL, and
// its key would hold no released record. It returns how long to wait before looking
// again.
func (m *Manager) giveBack(ctx context.Context, ts *tagState, h *holder) time.Duration {
	rec, err := m.releasedRecord()
	if err != nil {
		return m.cfg.retryInterval()
	}
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	_, err = m.leaders.Update(callCtx, wire.TagKey(ts.name), rec, h.rev)
	cancel()
	switch {
	case err == nil:
		ts.acquireFailures = 0
		m.log.Info("monotonic: a lease record of this dispenser's that no term serves given back", "tag", ts.name, "revision", h.rev)
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
		// Written since (our own release, most often, that the watch has not
		// delivered yet), or expired: look at the key itself.
		if m.refreshHolder(ctx, ts) {
			return 0
		}
	case ctx.Err() == nil:
		if ts.acquireFailures++; ts.acquireFailures == 1 {
			m.log.Warn("monotonic: a lease record of this dispenser's that no term serves not given back, retrying", "tag", ts.name, "err", err, "retry_every", m.cfg.retryInterval())
		}
	}
	return m.cfg.retryInterval()
}

// releasedRecord is this dispenser's released lease record.
func (m *Manager) releasedRecord() ([]byte, error) {
	return json.Marshal(leaseRecord{Node: m.cfg.NodeID, Instance: m.instance, TTLMs: m.cfg.LeaseTTL.Milliseconds(), Released: true})
}

// refreshHolder reads the lease key into the view: a revision the watch has not
// delivered yet, or the key's absence (it expired) as a deleted record. It reports
// whether the view changed.
func (m *Manager) refreshHolder(ctx context.Context, ts *tagState) bool {
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	e, err := m.leaders.Get(callCtx, wire.TagKey(ts.name))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.holders[ts.name]
	var h *holder
	switch {
	case err != nil && prev != nil && prev.gone:
		return false
	case err != nil && prev != nil:
		h = &holder{rev: prev.rev, gone: true, seen: m.now()}
	case err != nil:
		h = &holder{gone: true, seen: m.now()}
	case prev != nil && e.Revision() < prev.rev:
		return false // the watch is ahead already
	default:
		h = holderOf(e, prev, m.now())
	}
	if h == prev {
		return false
	}
	m.setHolder(ts.name, prev, h)
	return true
}

// acquire writes this dispenser's lease record (create-only when rev is 0, else over
// revision rev) and starts the term, serving from notBefore at the earliest. A fenced
// term serves from half a TTL after the write returned: the previous leader, whose
// record is gone, stopped serving at half a TTL after the send of its last successful
// renewal, which the server stored before this write, so before it returned.
func (m *Manager) acquire(ctx context.Context, ts *tagState, rev uint64, fenced bool, notBefore time.Duration) (*term, error) {
	t := &term{subject: m.nc.NewInbox(), seq: newSequence()}
	t.serveFrom.Store(math.MaxInt64)
	rec, err := json.Marshal(leaseRecord{Node: m.cfg.NodeID, Instance: m.instance, Subject: t.subject, TTLMs: m.cfg.LeaseTTL.Milliseconds()})
	if err != nil {
		return nil, err
	}
	t.record = rec
	// Subscribed before the record names the subject: the server registers it before
	// the write, which comes later on the same connection.
	if t.sub, err = m.nc.Subscribe(t.subject, m.forwarded(ts, t)); err != nil {
		return nil, err
	}
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	sent := m.now()
	if rev == 0 {
		t.rev, err = m.leaders.Create(callCtx, wire.TagKey(ts.name), rec)
	} else {
		t.rev, err = m.leaders.Update(callCtx, wire.TagKey(ts.name), rec, rev)
	}
	cancel()
	acked := m.now()
	if err != nil {
		_ = t.sub.Unsubscribe()
		return nil, err
	}
	t.validUntil.Store(int64(sent + m.cfg.LeaseTTL/2))
	from := acked
	if fenced {
		from += m.cfg.LeaseTTL / 2
	}
	t.fenceFrom = max(from, notBefore)
	t.serveFrom.Store(int64(max(t.fenceFrom, ts.settleUntil)))
	loadCtx, stopLoader := context.WithCancel(ctx)
	t.stopLoader = stopLoader
	ts.term.Store(t)
	ts.terms.Add(1)
	ts.changed.fire()
	if !m.spawn(func(context.Context) { m.load(loadCtx, ts, t) }) {
		m.endTerm(ts, t)
		return nil, context.Canceled
	}
	m.log.Info("monotonic: leading tag", "tag", ts.name, "revision", t.rev, "fenced", fenced, "serves_in", max(t.startsAt()-acked, 0))
	return t, nil
}

// lead renews t every RenewInterval until it ends: its validity ran out (renewals
// failed for half a TTL), another dispenser's record replaced ours, or ctx ended (then
// the lease is released). It returns the revision of our record when the term ended
// with our record still the last one known, else 0.
func (m *Manager) lead(ctx context.Context, ts *tagState, t *term) uint64 {
	tick := time.NewTicker(m.cfg.RenewInterval)
	defer tick.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			m.release(ts, t)
			return 0
		case <-ts.poke:
			if h := ts.holder.Load(); h != nil && h.rev > t.rev && (h.gone || h.rec.Instance != m.instance) {
				m.endTerm(ts, t)
				m.log.Warn("monotonic: another record replaced our lease; stopped serving", "tag", ts.name, "holder", wire.Quote(h.rec.Node), "revision", h.rev)
				return 0
			}
			if !m.mayLead(ts.name) {
				// Marked ordinary while a live record of ours kept the tag monotonic:
				// give the lease back, after which the tag is ordinary everywhere.
				m.release(ts, t)
				return 0
			}
			continue
		case <-tick.C:
		}
		sent := m.now()
		if int64(sent) >= t.validUntil.Load() {
			m.endTerm(ts, t)
			m.log.Warn("monotonic: lease not renewed for half its TTL; stopped serving", "tag", ts.name, "ttl", m.cfg.LeaseTTL)
			return t.rev
		}
		callCtx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
		rev, err := m.leaders.Update(callCtx, wire.TagKey(ts.name), t.record, t.rev)
		cancel()
		switch {
		case err == nil:
			t.rev, failures = rev, 0
			if !t.extend(m.now(), sent+m.cfg.LeaseTTL/2) {
				m.endTerm(ts, t)
				m.log.Warn("monotonic: lease renewed after it lapsed; stopped serving, taking it again", "tag", ts.name)
				return t.rev
			}
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
			if rev, ok := m.ownRevision(ctx, ts, t); ok {
				t.rev = rev // an earlier renewal timed out here but was stored: still ours
				continue
			}
			m.endTerm(ts, t)
			m.log.Warn("monotonic: lease lost; stopped serving", "tag", ts.name, "err", err)
			return 0
		case ctx.Err() == nil:
			if failures++; failures == 1 {
				m.log.Warn("monotonic: lease renewal failed, retrying", "tag", ts.name, "err", err)
			}
		}
	}
}

// endTerm ends t: it serves nothing more and its inbox is gone. The highest ID it
// handed out joins what this dispenser passed on: a later leader's answer must lie
// above it.
func (m *Manager) endTerm(ts *tagState, t *term) {
	ts.term.CompareAndSwap(t, nil)
	t.end()
	raise(&ts.passed, t.seq.highest())
	ts.changed.fire()
}

// release ends t and writes a released record over ours, so that the next leader need
// not wait out the lease; best effort, as a record left behind simply expires.
func (m *Manager) release(ts *tagState, t *term) {
	m.endTerm(ts, t)
	rec, err := m.releasedRecord()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, err = m.leaders.Update(ctx, wire.TagKey(ts.name), rec, t.rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		if rev, ok := m.ownRevision(ctx, ts, t); ok {
			_, err = m.leaders.Update(ctx, wire.TagKey(ts.name), rec, rev)
		}
	}
	if err != nil {
		m.log.Warn("monotonic: lease not released; it expires by itself", "tag", ts.name, "err", err)
		return
	}
	m.log.Info("monotonic: lease released", "tag", ts.name)
}

// ownRevision reads the lease key after a write of t found another revision than
// t.rev: when the latest record is t's own (a renewal that timed out here was stored
// all the same), every write since t.rev was t's, by compare-and-set, and the chain
// goes on from the revision it returns.
func (m *Manager) ownRevision(ctx context.Context, ts *tagState, t *term) (uint64, bool) {
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	e, err := m.leaders.Get(callCtx, wire.TagKey(ts.name))
	if err != nil || e.Revision() <= t.rev || !bytes.Equal(e.Value(), t.record) {
		return 0, false
	}
	return e.Revision(), true
}
