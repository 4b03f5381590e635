package monotonic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// releaseTimeout bounds writing the released record when a leader stops.
const releaseTimeout = 2 * time.Second

// campaign is one marked tag's life on this dispenser until ctx ends: take the lease
// when it is free (or surely expired), lead while it holds it, follow otherwise.
func (m *Manager) campaign(ctx context.Context, ts *tagState) {
	var own uint64 // the revision of our own record after a term ended; 0: none known
	retry := time.NewTimer(0)
	defer retry.Stop()
	for ctx.Err() == nil {
		t, wait := m.tryAcquire(ctx, ts, own)
		if t != nil {
			own = m.lead(ctx, ts, t)
			continue
		}
		own = 0
		if !retry.Stop() {
			select {
			case <-retry.C:
			default:
			}
		}
		retry.Reset(wait)
		select {
		case <-ctx.Done():
		case <-ts.poke:
		case <-retry.C:
		}
	}
}

// tryAcquire takes the tag's lease if the view says it may be had, and returns the new
// term; else it returns how long to wait before looking again. Every write but a
// create is a compare-and-set on the revision the view holds, so it succeeds only if
// nobody wrote the key since:
//   - own, the revision of a record of ours whose term ended: nobody else led since;
//   - a released record: its leader stopped serving before it wrote it;
//   - a record this dispenser has seen unchanged for a whole lease TTL: its leader's
//     last renewal was sent before it was seen, so it stopped serving half a TTL later,
//     half a TTL ago by now;
//   - absent or deleted (no record says when its leader last renewed): a create-only
//     write, fenced (see acquire).
func (m *Manager) tryAcquire(ctx context.Context, ts *tagState, own uint64) (*term, time.Duration) {
	h := ts.holder.Load()
	now := m.now()
	var rev uint64
	fenced := true
	switch {
	case own != 0 && (h == nil || h.rev <= own):
		rev, fenced = own, false
	case h == nil || h.gone: // no record: a fenced create
	case h.rec.Released || h.rec.Instance == m.instance:
		rev, fenced = h.rev, false
	default:
		silent := max(m.cfg.LeaseTTL, time.Duration(h.rec.TTLMs)*time.Millisecond)
		if now-h.seen < silent {
			return nil, h.seen + silent - now
		}
		rev, fenced = h.rev, false
	}
	t, err := m.acquire(ctx, ts, rev, fenced)
	switch {
	case err == nil:
		ts.acquireFailures = 0
		return t, 0
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		// Lost a race, or the view is behind the bucket (a watch that lags; a record
		// that expired, which no watch reports): look at the key itself.
		m.refreshHolder(ctx, ts)
	case ctx.Err() == nil:
		if ts.acquireFailures++; ts.acquireFailures == 1 {
			m.log.Warn("monotonic: cannot take the lease, retrying", "tag", ts.name, "err", err, "retry_every", m.cfg.retryInterval())
		}
	}
	return nil, m.cfg.retryInterval()
}

// refreshHolder reads the lease key into the view: a revision the watch has not
// delivered yet, or the key's absence (it expired) as a deleted record.
func (m *Manager) refreshHolder(ctx context.Context, ts *tagState) {
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	e, err := m.leaders.Get(callCtx, ts.name)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.holders[ts.name]
	var h *holder
	switch {
	case err != nil && prev != nil:
		h = &holder{rev: prev.rev, gone: true, seen: m.now()}
	case err != nil:
		h = &holder{gone: true, seen: m.now()}
	case prev != nil && e.Revision() < prev.rev:
		return // the watch is ahead already
	default:
		h = holderOf(e, prev, m.now())
	}
	m.holders[ts.name] = h
	if m.tags[ts.name] == ts {
		ts.holder.Store(h)
	}
}

// acquire writes this dispenser's lease record (create-only when rev is 0, else over
// revision rev) and starts the term. A fenced term serves from half a TTL after the
// write returned: the previous leader, whose record is gone, stopped serving at half a
// TTL after the send of its last successful renewal, which the server stored before
// this write, so before it returned.
func (m *Manager) acquire(ctx context.Context, ts *tagState, rev uint64, fenced bool) (*term, error) {
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
		t.rev, err = m.leaders.Create(callCtx, ts.name, rec)
	} else {
		t.rev, err = m.leaders.Update(callCtx, ts.name, rec, rev)
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
	t.serveFrom.Store(int64(max(from, ts.settleUntil)))
	loadCtx, stopLoader := context.WithCancel(ctx)
	t.stopLoader = stopLoader
	ts.term.Store(t)
	ts.terms.Add(1)
	if !m.spawn(func(context.Context) { m.load(loadCtx, ts, t) }) {
		m.endTerm(ts, t)
		return nil, context.Canceled
	}
	m.log.Info("monotonic: leading tag", "tag", ts.name, "revision", t.rev, "fenced", fenced, "serves_in", t.startsAt()-acked)
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
				m.log.Warn("monotonic: another record replaced our lease; stopped serving", "tag", ts.name, "holder", h.rec.Node, "revision", h.rev)
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
		rev, err := m.leaders.Update(callCtx, ts.name, t.record, t.rev)
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

// endTerm ends t: it serves nothing more and its inbox is gone.
func (m *Manager) endTerm(ts *tagState, t *term) {
	ts.term.CompareAndSwap(t, nil)
	t.end()
}

// release ends t and writes a released record over ours, so that the next leader need
// not wait out the lease; best effort, as a record left behind simply expires.
func (m *Manager) release(ts *tagState, t *term) {
	m.endTerm(ts, t)
	rec, err := json.Marshal(leaseRecord{Node: m.cfg.NodeID, Instance: m.instance, TTLMs: m.cfg.LeaseTTL.Milliseconds(), Released: true})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, err = m.leaders.Update(ctx, ts.name, rec, t.rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		if rev, ok := m.ownRevision(ctx, ts, t); ok {
			_, err = m.leaders.Update(ctx, ts.name, rec, rev)
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
	e, err := m.leaders.Get(callCtx, ts.name)
	if err != nil || e.Revision() <= t.rev || !bytes.Equal(e.Value(), t.record) {
		return 0, false
	}
	return e.Revision(), true
}
