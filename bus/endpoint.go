package bus

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// handler serves one request of an endpoint on the endpoint's delivery goroutine;
// start is when it was delivered (Service.now). It returns the answer it sent, for the
// Observer, or the zero outcome when there is nothing to observe now (an admin call, a
// request answered later off the delivery goroutine, which observes it itself).
type handler func(e *endpoint, m *nats.Msg, start time.Duration) outcome

// outcome is an answer sent on the delivery goroutine, as the Observer is told it.
type outcome struct {
	kind      string // "": nothing to observe
	code, ids int
}

// endpoint is one subject of the service: a queue subscription, whose handler nats.go
// runs serially on the subscription's own goroutine, and the figures $SRV.STATS shows
// for it, counted as micro counts them.
type endpoint struct {
	name, subject string
	handle        handler
	sub           *nats.Subscription
	kind          wire.Kind // of an ID endpoint, whose core figures its $SRV.STATS data shows
	isIDs         bool      // an ID endpoint

	requests atomic.Uint64 // every request delivered, counted before it is handled
	errors   atomic.Uint64 // error replies sent, and requests NATS dropped (slow consumer)
	busy     atomic.Int64  // ns spent handling requests on the delivery goroutine
	lastErr  atomic.Pointer[string]
	refused  atomic.Uint64 // requests dropped unanswered by the reply guard

	// Scratch space of the delivery goroutine, reused from one request to the next: the
	// IDs of a reply and its encoding. Nothing else may touch them, which is why a
	// request answered off the delivery goroutine takes its own from the service's pools.
	// They grow to the largest batch asked (at most MaxBatch) and stay.
	ids []int64
	buf []byte
}

// deliver is the subscription's message handler: the reply guard, the endpoint's
// handler, and the counts. The same two reads of the monotonic clock time the request
// for $SRV.STATS and for the Observer: on a VM a read can cost over 100 ns, as much as
// the rest of an ID request's handling.
func (s *Service) deliver(e *endpoint) nats.MsgHandler {
	return func(m *nats.Msg) {
		start := s.now()
		// Counted before the reply goes out, so that a client that has its answer finds
		// it in $SRV.STATS (counted after, a stats request sent on receipt of the answer
		// could overtake the count: seen under load).
		e.requests.Add(1)
		var o outcome
		if s.guard.allow(e.name, &e.refused, m.Subject, m.Reply) {
			o = e.handle(e, m, start)
		}
		took := s.now() - start
		e.busy.Add(int64(took))
		if o.kind != "" && s.observer != nil {
			s.observer.Observe(wire.TransportNATS, o.kind, o.code, took.Seconds(), o.ids)
		}
	}
}

// scratchIDs returns n IDs' worth of the endpoint's scratch space.
func (e *endpoint) scratchIDs(n int) []int64 {
	if cap(e.ids) < n {
		e.ids = make([]int64, max(n, 16))
	}
	return e.ids[:n]
}

// encode encodes ids into the endpoint's scratch space; the reply must be published
// before the next request is handled.
func (e *endpoint) encode(ids []int64, enc wire.Encoding) []byte {
	if need := len(ids) * wire.MaxTextID; cap(e.buf) < need {
		e.buf = make([]byte, 0, max(need, 64))
	}
	e.buf = wire.AppendIDs(e.buf[:0], ids, enc)
	return e.buf
}

// failed counts an error of the endpoint and keeps its text for the stats.
func (e *endpoint) failed(text string) {
	e.errors.Add(1)
	e.lastErr.Store(&text)
}

// reply publishes an answer to a request. The connection copies b into its write buffer
// before returning, so b may be reused at once.
func (s *Service) reply(e *endpoint, subject, reply string, b []byte) {
	if err := s.nc.Publish(reply, b); err != nil {
		e.failed(err.Error())
		s.logger.Warn("reply not sent", "subject", subject, "err", err)
	}
}

// replyError publishes an error answer: no body, the code and description in the
// Nats-Service-Error-Code and Nats-Service-Error headers of the NATS services
// convention, counted for $SRV.STATS as micro's req.Error counts it ("code:description").
func (s *Service) replyError(e *endpoint, subject, reply string, code int, desc string) {
	c := strconv.Itoa(code)
	e.failed(c + ":" + desc)
	m := &nats.Msg{Subject: reply, Header: nats.Header{
		wire.ServiceErrorCodeHeader: []string{c},
		wire.ServiceErrorHeader:     []string{desc},
	}}
	if err := s.nc.PublishMsg(m); err != nil {
		s.logger.Warn("error reply not sent", "subject", subject, "code", code, "err", err)
	}
}
