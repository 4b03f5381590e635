package workerid

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// TimeResponder answers <prefix>.time with this node's clock as Unix ms in decimal, and
// names the node in the wire.NodeIDHeader header, for the peer time check of nodes that start
// for the first time. It subscribes without a queue group: every dispenser answers.
type TimeResponder struct {
	nc      *nats.Conn
	subject string
	replies wire.Subjects // whose ReplyAllowed decides where an answer may go
	nodeID  string
	clock   snowflake.Clock
	log     *slog.Logger

	mu  sync.Mutex
	sub *nats.Subscription
}

// NewTimeResponder returns a responder for nodeID on <prefix>.time (wire.DefaultPrefix is
// "leaf"), answering with clock (snowflake.SystemClock() in service). logger nil
// discards. Errors wrap ErrInvalidConfig or ErrInvalidNodeID.
func NewTimeResponder(nc *nats.Conn, prefix, nodeID string, clock snowflake.Clock, logger *slog.Logger) (*TimeResponder, error) {
	const component = "time responder"
	if nc == nil {
		return nil, invalid(component, "NATS connection is nil")
	}
	if err := CheckNodeID(nodeID); err != nil {
		return nil, fmt.Errorf("%s: node ID: %w", component, err)
	}
	if prefix == "" {
		return nil, invalid(component, "prefix is empty, want the subject prefix (%q by default)", wire.DefaultPrefix)
	}
	if clock == nil {
		return nil, invalid(component, "clock is nil, want the generator's clock (snowflake.SystemClock() in service)")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &TimeResponder{nc: nc, subject: TimeSubject(prefix), replies: wire.Subjects{Prefix: prefix}, nodeID: nodeID, clock: clock, log: logger}, nil
}

// Start subscribes and returns once the server has the subscription, so a peer check
// that starts afterwards hears this node. Starting twice is a no-op.
func (r *TimeResponder) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub != nil {
		return nil
	}
	sub, err := r.nc.Subscribe(r.subject, r.answer)
	if err != nil {
		return fmt.Errorf("time responder: subscribe to %s: %w", r.subject, err)
	}
	if err := r.nc.Flush(); err != nil {
		sub.Unsubscribe()
		return fmt.Errorf("time responder: subscribe to %s: %w", r.subject, err)
	}
	r.sub = sub
	return nil
}

// Stop unsubscribes. Safe to call twice and before Start.
func (r *TimeResponder) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub != nil {
		r.sub.Unsubscribe()
		r.sub = nil
	}
}

// Run is Start, then Stop when ctx ends.
func (r *TimeResponder) Run(ctx context.Context) error {
	if err := r.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	r.Stop()
	return nil
}

// answer answers m, unless its reply subject is not an inbox: an answer is a publish with
// this dispenser's rights, so one aimed at $KV.…, $JS.… or the deployment's own subjects
// is dropped, as every endpoint of the service drops it (wire's reply rule).
func (r *TimeResponder) answer(m *nats.Msg) {
	if !r.replies.ReplyAllowed(m.Reply) {
		return
	}
	reply := nats.NewMsg(m.Reply)
	reply.Header.Set(wire.NodeIDHeader, r.nodeID)
	reply.Data = strconv.AppendInt(nil, r.clock.Now().UnixMilli(), 10)
	if err := m.RespondMsg(reply); err != nil {
		r.log.Warn("time responder: reply failed", "err", err)
	}
}
