package monotonic

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// A forwarded request is a NATS request from a follower to the leader's inbox for the
// tag: header TagHeader names the tag, the body holds the counts of the requests it
// carries, in decimal, separated by single spaces ("1 1 5"). The answer holds all
// their IDs in order, as 8-byte big-endian integers (the binary encoding), or the
// service error headers. Followers split the IDs in the order of the counts.

// TagHeader names the tag of a forwarded request.
const TagHeader = "Leaf-Tag"

// forwarder is a follower's queue of requests for one tag's leader. Requests that
// arrive while MaxInFlight forwarded messages are under way wait and go together in
// the next one: under load, one round trip to the leader carries many requests.
type forwarder struct {
	mu      sync.Mutex
	queue   []*pending
	senders int
}

// pending is one request waiting for its IDs from the leader: the sender fills dst
// (which it owns until then) and calls done once.
type pending struct {
	dst  []int64
	done func(error)
}

// forward fills dst through the tag's leader, waiting at most until ctx ends. The
// sender fills a buffer of its own, so that a request given up on leaves dst alone.
func (m *Manager) forward(ctx context.Context, ts *tagState, dst []int64) error {
	buf := make([]int64, len(dst))
	result := make(chan error, 1)
	m.forwardAsync(ts, buf, func(err error) { result <- err })
	select {
	case err := <-result:
		if err == nil {
			copy(dst, buf)
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: monotonic: tag %q: the leader did not answer in time: %w", wire.ErrUnavailable, ts.name, ctx.Err())
	}
}

// forwardAsync queues dst for the tag's leader; done is called once, on a sender's
// goroutine or at once.
func (m *Manager) forwardAsync(ts *tagState, dst []int64, done func(error)) {
	if h := ts.holder.Load(); !m.leaderKnown(h) {
		ts.forwardErrors.Add(1)
		done(noLeader(ts.name))
		return
	}
	if !m.enqueue(ts, &pending{dst: dst, done: done}) {
		ts.forwardErrors.Add(1)
		done(errNotReady)
	}
}

// leaderKnown reports whether h names another dispenser to forward to.
func (m *Manager) leaderKnown(h *holder) bool {
	return !h.free() && h.rec.Instance != m.instance && m.forwardable(h.rec.Subject)
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
	return fmt.Errorf("%w: monotonic: no leader of tag %q is known right now", wire.ErrUnavailable, tag)
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

// send forwards queued requests of ts, as many as fit in one message at a time, until
// the queue is empty, and answers each of them.
func (m *Manager) send(ctx context.Context, ts *tagState) {
	for {
		batch := m.nextBatch(ts)
		if batch == nil {
			return
		}
		ids, err := m.sendBatch(ctx, ts, batch)
		for _, p := range batch {
			if err != nil {
				ts.forwardErrors.Add(1)
				p.done(err)
				continue
			}
			ids = ids[copy(p.dst, ids):]
			ts.forwarded.Add(1)
			p.done(nil)
		}
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

// sendBatch sends one forwarded message to the leader as the view names it now, and
// returns the IDs of all its requests, in order. When the leader refuses or does not
// listen and the view names another leader meanwhile (a handover), it asks that one,
// once.
func (m *Manager) sendBatch(ctx context.Context, ts *tagState, batch []*pending) ([]int64, error) {
	h := ts.holder.Load()
	ids, err := m.sendTo(ctx, ts, h, batch)
	if err != nil && errors.Is(err, wire.ErrUnavailable) {
		if now := ts.holder.Load(); now != h && m.leaderKnown(now) && now.rec.Subject != h.rec.Subject {
			ids, err = m.sendTo(ctx, ts, now, batch)
		}
	}
	return ids, err
}

// sendTo sends one forwarded message to the leader of record h.
func (m *Manager) sendTo(ctx context.Context, ts *tagState, h *holder, batch []*pending) ([]int64, error) {
	if !m.leaderKnown(h) {
		return nil, noLeader(ts.name)
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
	msg := &nats.Msg{Subject: h.rec.Subject, Header: nats.Header{TagHeader: []string{ts.name}}, Data: body}
	ts.forwardMessages.Add(1)
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ForwardTimeout)
	defer cancel()
	resp, err := m.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("%w: monotonic: tag %q: leader %s no longer listens (gone, or its lease ended)", wire.ErrUnavailable, ts.name, h.rec.Node)
		}
		return nil, fmt.Errorf("%w: monotonic: tag %q: forward to leader %s: %w", wire.ErrUnavailable, ts.name, h.rec.Node, err)
	}
	if err := wire.ReplyError(resp.Header.Get(wire.ServiceErrorCodeHeader), resp.Header.Get(wire.ServiceErrorHeader)); err != nil {
		return nil, err
	}
	ids, err := wire.DecodeIDs(make([]int64, 0, total), resp.Data, wire.Binary)
	if err == nil && len(ids) != total {
		err = fmt.Errorf("%w: %d IDs for %d asked", wire.ErrBadReply, len(ids), total)
	}
	if err != nil {
		return nil, fmt.Errorf("monotonic: tag %q: answer of leader %s: %w", ts.name, h.rec.Node, err)
	}
	return ids, nil
}

// forwarded serves the requests followers forward to t's inbox, on the subscription's
// goroutine: one forwarded message at a time, in order, each waiting at most WaitMax
// for a segment.
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
		if err == nil && msg.Header.Get(TagHeader) != ts.name {
			err = wire.BadRequest("forwarded request for tag %s reached the leader of tag %q", wire.Quote(msg.Header.Get(TagHeader)), ts.name)
		}
		if err == nil {
			ids := make([]int64, total)
			ctx, cancel := context.WithTimeout(context.Background(), m.cfg.WaitMax)
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
