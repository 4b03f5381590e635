package monotonic

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// A forwarded request is a NATS request from a follower to the leader's inbox for the
// tag: header wire.TagHeader names the tag (its subject token), the body holds the counts of the requests it
// carries, in decimal, separated by single spaces ("1 1 5"). The answer holds all
// their IDs in order, as 8-byte big-endian integers (the binary encoding), or the
// service error headers. Followers split the IDs in the order of the counts.

// forwarder is a tag's queue of requests that TryFill could not serve: requests for
// another dispenser's leader, and requests that wait for a leader (a hand-over, this
// dispenser's term waiting out the previous one, a leader not verified yet). At most
// MaxInFlight senders take them off it, each one forwarded message (or one local fill)
// at a time: under load, one round trip to the leader carries many requests.
type forwarder struct {
	mu      sync.Mutex
	queue   []*pending
	senders int
}

// pending is one request waiting for its IDs: the sender fills dst (which it owns until
// then) and calls done once, by deadline (on the Manager's clock) at the latest.
type pending struct {
	dst      []int64
	done     func(error)
	deadline time.Duration
}

// errLeaderGone is a forward that found no subscriber on the leader's inbox: its
// process or connection is gone, or its term ended.
var errLeaderGone = errors.New("no longer listens (gone, or its lease ended)")

// queued fills dst through the queue, waiting at most wait (and until ctx ends). The
// sender fills a buffer of its own, so that a request given up on leaves dst alone.
func (m *Manager) queued(ctx context.Context, ts *tagState, dst []int64, wait time.Duration) error {
	buf := make([]int64, len(dst))
	result := make(chan error, 1)
	if !m.enqueue(ts, &pending{dst: buf, done: func(err error) { result <- err }, deadline: m.now() + wait}) {
		ts.forwardErrors.Add(1)
		return errNotReady
	}
	select {
	case err := <-result:
		if err == nil {
			copy(dst, buf)
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: monotonic: tag %q: no leader answered in time: %w", wire.ErrUnavailable, ts.name, ctx.Err())
	}
}

// leaderKnown reports whether h names another dispenser to forward to, whose record is
// live.
func (m *Manager) leaderKnown(h *holder) bool {
	return h.live() && h.rec.Instance != m.instance && m.forwardable(h.rec.Subject)
}

// forwardable reports whether a lease record's subject may receive forwarded requests:
// an inbox, by the reply rule (wire.Subjects.ReplyAllowed). A leader always records one
// (nats.Conn.NewInbox); a record naming a KV key, a pool subject or a dispenser subject
// (a bucket written by hand, or by anything but a leader) is no leader to forward to,
// since followers publish there with this dispenser's rights.
func (m *Manager) forwardable(subject string) bool {
	return subject != "" && m.subjects.ReplyAllowed(subject)
}

func noLeader(tag string) error {
	return fmt.Errorf("%w: monotonic: no verified leader of tag %q is known right now", wire.ErrUnavailable, tag)
}

// enqueue queues p and starts a sender unless MaxInFlight already run.
func (m *Manager) enqueue(ts *tagState, p *pending) bool {
	f := &ts.fwd
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, p)
	if f.senders >= m.cfg.MaxInFlight {
		return true
	}
	f.senders++
	if !m.spawn(func(ctx context.Context) { m.send(ctx, ts) }) {
		f.senders--
		f.queue = f.queue[:len(f.queue)-1]
		return false
	}
	return true
}

// send serves queued requests of ts, as many as fit in one forwarded message at a time,
// until the queue is empty.
func (m *Manager) send(ctx context.Context, ts *tagState) {
	for {
		batch := m.nextBatch(ts)
		if batch == nil {
			return
		}
		m.serveBatch(ctx, ts, batch)
	}
}

// nextBatch takes the requests for one forwarded message off the queue (nil when it
// is empty, and then the sender ends).
func (m *Manager) nextBatch(ts *tagState) []*pending {
	f := &ts.fwd
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.queue) == 0 {
		f.senders--
		f.queue = nil
		return nil
	}
	total, k := 0, 0
	for k < len(f.queue) && (k == 0 || total+len(f.queue[k].dst) <= m.cfg.MaxForward) {
		total += len(f.queue[k].dst)
		k++
	}
	batch := f.queue[:k:k]
	f.queue = f.queue[k:]
	return batch
}

// serveBatch answers every request of batch: from this dispenser's term when it serves
// the tag, else from the verified leader through one forwarded message. Until one of
// them can serve (no leader known or verified, a term waiting out the previous one, a
// leader that refused or no longer listens), it waits for the tag's state to change,
// and answers each request 503 once its deadline passed.
func (m *Manager) serveBatch(ctx context.Context, ts *tagState, batch []*pending) {
	why := noLeader(ts.name)
	for {
		now := m.now()
		batch = m.expire(ts, batch, now, why)
		if len(batch) == 0 {
			return
		}
		if ctx.Err() != nil || ts.ctx.Err() != nil {
			m.answerAll(ts, batch, fmt.Errorf("%w: monotonic: tag %q is no longer served as monotonic here (stopping, or its mark changed): ask again", wire.ErrUnavailable, ts.name))
			return
		}
		changed := ts.changed.wait()
		until := earliest(batch)
		if t := ts.term.Load(); t != nil {
			if t.serving(now) {
				batch = m.fillLocal(ctx, ts, t, batch)
				why = errNotServing
				continue
			}
			if start := t.startsAt(); now < start {
				why = fmt.Errorf("%w: monotonic: this dispenser took the lease of tag %q and serves it once the previous leader's lease is surely over", wire.ErrUnavailable, ts.name)
				if start != math.MaxInt64 {
					until = min(until, start)
				}
			} else {
				why = errNotServing // lapsed: the campaign ends it and looks again
				until = min(until, now+m.cfg.retryInterval())
			}
			m.sleep(ctx, ts, changed, until)
			continue
		}
		h := ts.holder.Load()
		if !m.verifiedLeader(ts, h) {
			why = noLeader(ts.name)
			if m.leaderKnown(h) && ts.verified.Load() == nil {
				poke(ts.poke) // a campaign that waits for a timer verifies now
			}
			m.sleep(ctx, ts, changed, until)
			continue
		}
		ids, err := m.sendTo(ctx, ts, h, batch, until-now)
		if err == nil {
			for _, p := range batch {
				ids = ids[copy(p.dst, ids):]
				ts.forwarded.Add(1)
				p.done(nil)
			}
			return
		}
		if !errors.Is(err, wire.ErrUnavailable) {
			m.answerAll(ts, batch, err) // 400, 404, 500: the leader's answer is the answer
			return
		}
		why = err
		if errors.Is(err, errLeaderGone) {
			ts.unreachable.Store(h.rev)
			poke(ts.poke)
		}
		// Look again once the view changes, or after a moment (the leader refused: its
		// term not started yet, or ended).
		m.sleep(ctx, ts, changed, min(until, m.now()+m.cfg.retryInterval()))
	}
}

// fillLocal fills each request of batch from t, this dispenser's term, each waiting for
// a segment until its deadline (WaitMax at most); it returns those left because the
// term ended meanwhile.
func (m *Manager) fillLocal(ctx context.Context, ts *tagState, t *term, batch []*pending) []*pending {
	var left []*pending
	for _, p := range batch {
		wait := min(p.deadline-m.now(), m.cfg.WaitMax)
		fctx, cancel := context.WithTimeout(ctx, wait)
		err := m.fillTerm(fctx, ts, t, p.dst)
		cancel()
		switch {
		case errors.Is(err, errNotServing) || errors.Is(err, errTermEnded):
			left = append(left, p)
		case err != nil:
			ts.forwardErrors.Add(1)
			p.done(err)
		default:
			p.done(nil)
		}
	}
	return left
}

// expire answers the requests of batch whose deadline passed with a 503 that says why
// no leader served them, and returns the others.
func (m *Manager) expire(ts *tagState, batch []*pending, now time.Duration, why error) []*pending {
	kept := batch[:0]
	for _, p := range batch {
		if p.deadline > now {
			kept = append(kept, p)
			continue
		}
		ts.forwardErrors.Add(1)
		p.done(fmt.Errorf("%w: monotonic: tag %q: no leader served the request within its wait: %v", wire.ErrUnavailable, ts.name, why))
	}
	return kept
}

func (m *Manager) answerAll(ts *tagState, batch []*pending, err error) {
	for _, p := range batch {
		ts.forwardErrors.Add(1)
		p.done(err)
	}
}

// earliest is the first deadline of batch.
func earliest(batch []*pending) time.Duration {
	d := batch[0].deadline
	for _, p := range batch[1:] {
		d = min(d, p.deadline)
	}
	return d
}

// sleep waits until changed fires, the clock reaches until, or ctx or the tag's
// campaign ends.
func (m *Manager) sleep(ctx context.Context, ts *tagState, changed <-chan struct{}, until time.Duration) {
	d := until - m.now()
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-changed:
	case <-timer.C:
	case <-ctx.Done():
	case <-ts.ctx.Done():
	}
}

// sendTo sends one forwarded message to the leader of record h, within timeout (and
// ForwardTimeout), and returns the IDs of all its requests, in order. The answer is
// checked before anything of it is passed on: as many IDs as asked, strictly
// increasing, and above every ID of the tag this dispenser passed on before it asked.
// One that is not is refused (503) and counted: a leader never sends such an answer,
// so it comes from something else that answers on the leader's inbox.
func (m *Manager) sendTo(ctx context.Context, ts *tagState, h *holder, batch []*pending, timeout time.Duration) ([]int64, error) {
	timeout = min(timeout, m.cfg.ForwardTimeout)
	if timeout <= 0 {
		return nil, fmt.Errorf("%w: monotonic: tag %q: no time left to forward", wire.ErrUnavailable, ts.name)
	}
	total := 0
	body := make([]byte, 0, 4*len(batch))
	for i, p := range batch {
		if i > 0 {
			body = append(body, ' ')
		}
		body = strconv.AppendInt(body, int64(len(p.dst)), 10)
		total += len(p.dst)
	}
	msg := &nats.Msg{Subject: h.rec.Subject, Header: nats.Header{wire.TagHeader: []string{wire.TagToken(ts.name)}}, Data: body}
	floor := ts.passed.Load()
	ts.forwardMessages.Add(1)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := m.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("%w: monotonic: tag %q: leader %s %w", wire.ErrUnavailable, ts.name, wire.Quote(h.rec.Node), errLeaderGone)
		}
		return nil, fmt.Errorf("%w: monotonic: tag %q: forward to leader %s: %w", wire.ErrUnavailable, ts.name, wire.Quote(h.rec.Node), err)
	}
	if err := wire.ReplyError(resp.Header.Get(wire.ServiceErrorCodeHeader), resp.Header.Get(wire.ServiceErrorHeader)); err != nil {
		return nil, err
	}
	ids, err := wire.DecodeIDs(make([]int64, 0, total), resp.Data, wire.Binary)
	if err == nil {
		err = checkAnswer(ids, total, floor)
	}
	if err != nil {
		ts.refusedAnswers.Add(1)
		if now := int64(m.now()); now-ts.answerWarned.Load() >= int64(m.cfg.LeaseTTL) {
			ts.answerWarned.Store(now)
			m.log.Warn("monotonic: refused an answer from the inbox of the tag's leader", "tag", ts.name, "leader", wire.Quote(h.rec.Node), "err", err)
		}
		return nil, fmt.Errorf("%w: monotonic: tag %q: refused the answer of leader %s: %w", wire.ErrUnavailable, ts.name, wire.Quote(h.rec.Node), err)
	}
	raise(&ts.passed, ids[len(ids)-1])
	return ids, nil
}

// errBadAnswer is a leader's answer that breaks what a leader's answer always is.
var errBadAnswer = errors.New("not an answer a leader gives")

// checkAnswer checks a leader's answer to a forwarded message: want IDs, strictly
// increasing, the first above floor (the highest ID passed on before the message left).
func checkAnswer(ids []int64, want int, floor int64) error {
	if len(ids) != want {
		return fmt.Errorf("%w: %d IDs for %d asked", errBadAnswer, len(ids), want)
	}
	if ids[0] <= floor {
		return fmt.Errorf("%w: its first ID %d is not above %d, an ID already passed on", errBadAnswer, ids[0], floor)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			return fmt.Errorf("%w: ID %d follows %d", errBadAnswer, ids[i], ids[i-1])
		}
	}
	return nil
}

// forwarded serves the requests followers forward to t's inbox, on the subscription's
// goroutine: one forwarded message at a time, in order, each waiting at most WaitMax
// for the term to start and for a segment.
func (m *Manager) forwarded(ts *tagState, t *term) nats.MsgHandler {
	return func(msg *nats.Msg) {
		if !m.subjects.ReplyAllowed(msg.Reply) {
			m.refused.Add(1)
			return
		}
		reply := &nats.Msg{Subject: msg.Reply}
		// Each count is bounded by MaxForward rather than MaxBatch, so that a follower
		// configured with a larger --max-batch is not refused by the leader.
		total, err := parseCounts(msg.Data, m.cfg.MaxForward, m.cfg.MaxForward)
		if tag, perr := wire.ParseTagToken(msg.Header.Get(wire.TagHeader)); err == nil && (perr != nil || tag != ts.name) {
			err = wire.BadRequest("forwarded request for tag %s reached the leader of tag %q", wire.Quote(msg.Header.Get(wire.TagHeader)), ts.name)
		}
		if err == nil {
			ids := make([]int64, total)
			ctx, cancel := context.WithTimeout(context.Background(), m.cfg.WaitMax)
			// A term that waits out the previous leader holds the request until it
			// serves, when that is within WaitMax: the follower's time is better spent
			// waiting here than asking again.
			if start := t.startsAt(); start != math.MaxInt64 && start-m.now() <= m.cfg.WaitMax {
				m.sleepUntil(ctx, start)
			}
			err = m.fillTerm(ctx, ts, t, ids)
			cancel()
			reply.Data = wire.AppendIDs(make([]byte, 0, 8*total), ids, wire.Binary)
		}
		if err != nil {
			code, description := m.cfg.CodeOf(err)
			if code == 500 {
				m.log.Error("monotonic: forwarded request failed", "tag", ts.name, "err", err)
			}
			reply.Data = nil
			reply.Header = nats.Header{
				wire.ServiceErrorCodeHeader: []string{strconv.Itoa(code)},
				wire.ServiceErrorHeader:     []string{description},
			}
		}
		if err := m.nc.PublishMsg(reply); err != nil {
			m.log.Warn("monotonic: answer to a forwarded request not sent", "tag", ts.name, "err", err)
		}
	}
}

// parseCounts reads the counts of a forwarded request and returns their sum: each 1 to
// maxBatch, the sum at most maxForward.
func parseCounts(body []byte, maxBatch, maxForward int) (int, error) {
	total := 0
	for field := range bytes.SplitSeq(body, []byte{' '}) {
		n, err := wire.ParseCount(field, maxBatch)
		if err != nil || len(field) == 0 {
			return 0, wire.BadRequest("forwarded counts %s: want counts of 1 to %d separated by single spaces", wire.Quote(string(body)), maxBatch)
		}
		if total += n; total > maxForward {
			return 0, wire.BadRequest("forwarded counts add up to more than %d IDs", maxForward)
		}
	}
	return total, nil
}
